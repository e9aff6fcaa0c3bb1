// The load generator's ceiling: k6 against GET /healthz, which does no work
// in the service, spread over the same instances as the sale. No strategy
// can be measured faster than this on the same machine.
//
//   go tool k6 run -e BASE_URLS=http://127.0.0.1:8080 -e VUS=64 -e DURATION=5s healthz.js
import exec from 'k6/execution';
import http from 'k6/http';

import { waitReady } from './lib/api.js';
import { config } from './lib/config.js';
import { healthz } from './lib/profiles.js';
import { textSummary } from './lib/summary.js';

export const options = {
  scenarios: healthz(config),
  summaryTrendStats: ['avg', 'min', 'med', 'max', 'p(90)', 'p(95)', 'p(99)', 'count'],
};

export function setup() {
  waitReady(config.baseURLs, config.readyTimeout);
}

export default function () {
  const n = exec.scenario.iterationInTest % config.baseURLs.length;
  http.get(`${config.baseURLs[n]}/healthz`, {
    tags: { instance: `i${n + 1}`, name: 'GET /healthz' },
    responseType: 'none',
  });
}

export function handleSummary(data) {
  const text = textSummary(data, 'healthz (load generator ceiling)');
  const out = { stdout: text };
  out[config.summaryJSON] = JSON.stringify(data, null, 1);
  if (config.summaryText) out[config.summaryText] = text;
  return out;
}
