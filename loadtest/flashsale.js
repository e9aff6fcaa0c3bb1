// The flash sale: buyers race for a limited stock across several service
// instances, and teardown() proves from the service's own bookkeeping that
// nothing was oversold and that every sold unit is an order.
//
//   go tool k6 run -e BASE_URLS=http://127.0.0.1:8080 -e SCENARIO=burst flashsale.js
//
// Configuration: lib/config.js (environment, with defaults). Profiles:
// lib/profiles.js (burst: shared-iterations; steady: constant-arrival-rate).
// The run fails (exit 99) when the teardown's checks do not all pass.
import { check } from 'k6';
import http from 'k6/http';
import { Counter, Gauge, Trend } from 'k6/metrics';

import { audit, order, startSale, waitReady } from './lib/api.js';
import { config } from './lib/config.js';
import { profile } from './lib/profiles.js';
import { textSummary } from './lib/summary.js';

// A sold-out answer is the service working as intended, not a failed
// request: only 201 and 409 count as expected in http_req_failed.
http.setResponseCallback(http.expectedStatuses(201, 409));

const orders = new Counter('orders'); // 201: an order was created
const soldOut = new Counter('sold_out'); // 409: nothing left to sell
const busy = new Counter('busy'); // 503 busy|unavailable: nothing deducted, retry later
const errors = new Counter('errors'); // anything else, timeouts included
const latency = new Trend('order_latency', true); // POST /orders, every answer
// The same split by answer: a sold-out answer should be the cheapest the
// service gives (issue 26), so its p99 is held to the 201s' in one burst.
const createdLatency = new Trend('order_latency_created', true); // 201
const soldOutLatency = new Trend('order_latency_sold_out', true); // 409
// Milliseconds since the load started at which an answer (any, or a 201)
// arrived: their maxima give the window the load really took, so the
// runner can compute rates over the time the sale lasted rather than over
// the whole k6 run with its setup and teardown.
const answeredAt = new Trend('answered_at', true);
const soldAt = new Trend('sold_at', true);
// The audit that teardown() read, so the summary carries it.
const auditInitial = new Gauge('audit_initial');
const auditAvailable = new Gauge('audit_available');
const auditOrdered = new Gauge('audit_ordered');
const auditOrders = new Gauge('audit_orders');

export const options = {
  scenarios: profile(config),
  thresholds: {
    // The invariant. Checks made in teardown carry group "::teardown".
    'checks{group:::teardown}': ['rate==1'],
  },
  summaryTrendStats: ['avg', 'min', 'med', 'max', 'p(90)', 'p(95)', 'p(99)', 'count'],
  setupTimeout: `${config.readyTimeout + 30}s`,
  teardownTimeout: '30s',
  // The dashboard and the runner look for these.
  tags: { strategy: config.strategy || 'unknown', backend: config.backend || 'unknown' },
};

export function setup() {
  waitReady(config.baseURLs, config.readyTimeout);
  startSale(config.baseURLs[0], config.adminToken, config.sku, config.stock);
  return {
    sku: config.sku,
    stock: config.stock,
    instances: config.baseURLs.length,
    startedAt: Date.now(),
  };
}

// Per-VU constants, built once: the iteration below runs thousands of
// times a second on the same cores as the service, and every object it
// makes is k6 CPU taken from the figure being measured.
const instanceTags = config.baseURLs.map((_, n) => ({ instance: `i${n + 1}`, name: 'POST /orders' }));
const bodyPrefix = `{"sku":${JSON.stringify(config.sku)},"quantity":${config.quantity},"user_id":"u-${__VU}-`;

export default function (data) {
  // __VU and __ITER are plain numbers (k6/execution's scenario builds an
  // object on every read). Buyer __VU-__ITER is unique in the test. The
  // counters carry no instance tag (a tag set per sample is CPU too):
  // http_reqs{instance} has the split.
  const n = (__VU + __ITER) % config.baseURLs.length;
  const tags = instanceTags[n];
  const res = order(
    config.baseURLs[n],
    `${bodyPrefix}${__ITER}"}`,
    tags,
    config.requestTimeout,
    config.idempotencyKeys ? `${data.sku}-${data.startedAt}-${__VU}-${__ITER}` : '',
  );
  const at = Date.now() - data.startedAt;
  latency.add(res.timings.duration);
  answeredAt.add(at);
  switch (res.status) {
    case 201:
      orders.add(1);
      soldAt.add(at);
      createdLatency.add(res.timings.duration);
      break;
    case 409:
      soldOut.add(1);
      soldOutLatency.add(res.timings.duration);
      break;
    case 503:
      busy.add(1);
      break;
    default:
      // 0 is a transport error or a timeout; anything else a bug.
      errors.add(1, { ...tags, status: String(res.status) });
  }
}

export function teardown(data) {
  const a = audit(config.baseURLs[0], config.adminToken, data.sku);
  auditInitial.add(a.initial);
  auditAvailable.add(a.available);
  auditOrdered.add(a.ordered);
  auditOrders.add(a.orders);
  check(a, {
    'nothing oversold': (x) => x.available >= 0 && x.ordered <= x.initial,
    'every sold unit is an order': (x) => x.initial === x.available + x.ordered,
  });
}

export function handleSummary(data) {
  const title = `${config.scenario} ${config.backend}/${config.strategy}`.trim();
  const text = textSummary(data, title);
  const out = { stdout: text };
  out[config.summaryJSON] = JSON.stringify(data, null, 1);
  if (config.summaryText) out[config.summaryText] = text;
  return out;
}
