// Configuration of the load scripts, read from the environment
// (`k6 run -e NAME=value` or `NAME=value k6 run`). Every value has the
// default a manual run against one local instance needs; the demo runner
// (lab/cmd/demo) sets them all explicitly and records them in the report.

function env(name, def) {
  const v = __ENV[name];
  return v === undefined || v === '' ? def : v;
}

function int(name, def) {
  const raw = env(name, String(def));
  const v = Number(raw);
  if (!Number.isInteger(v) || v < 0) {
    throw new Error(`${name}=${raw} is not a non-negative integer`);
  }
  return v;
}

function bool(name, def) {
  const raw = String(env(name, String(def))).toLowerCase();
  return raw === 'true' || raw === '1' || raw === 'yes';
}

export const config = Object.freeze({
  // Comma-separated base URLs of the service instances; requests go round
  // robin over them and are tagged instance=i1, i2, … in that order.
  baseURLs: env('BASE_URLS', 'http://127.0.0.1:8080')
    .split(',')
    .map((s) => s.trim().replace(/\/+$/, ''))
    .filter((s) => s !== ''),
  // Bearer token of the admin routes (PUT /admin/stock, GET /admin/audit).
  adminToken: env('ADMIN_TOKEN', 'demo-admin-token'),
  // Which load profile to run: burst or steady (see lib/profiles.js).
  scenario: env('SCENARIO', 'burst'),
  // The SKU of the sale. It must be the same in every VU, so it cannot
  // default to anything random: init code runs once per VU.
  sku: env('SKU', 'k6-sale'),
  // Units put on sale by setup().
  stock: int('STOCK', 500),
  // Units each buyer asks for.
  quantity: int('QUANTITY', 1),
  // burst: buyers (one order each) and the VUs that click for them.
  buyers: int('BUYERS', 2000),
  vus: int('VUS', 200),
  // burst: the latest the last buyer may click; buyers not served by then
  // are reported as interrupted iterations.
  maxDuration: env('MAX_DURATION', '60s'),
  // steady: orders started per second, for DURATION, with up to MAX_VUS
  // orders in flight; an order that finds no free VU is a dropped iteration.
  rate: int('RATE', 200),
  duration: env('DURATION', '15s'),
  maxVUs: int('MAX_VUS', 200),
  // lifecycle.js: how long the buyers keep trying (seconds); the share of
  // winners who pay, the share of the others who cancel (the rest let the
  // hold lapse), the share of buyers who click twice at once; the pause
  // before a buyer told sold_out clicks again; how often a waiting VU reads
  // the audit to see whether every unit is paid.
  runSeconds: int('RUN_SECONDS', 20),
  payPercent: int('PAY_PERCENT', 50),
  cancelPercent: int('CANCEL_PERCENT', 50),
  twicePercent: int('TWICE_PERCENT', 25),
  retryPauseMs: int('RETRY_PAUSE_MS', 250),
  auditEveryMs: int('AUDIT_EVERY_MS', 1000),
  // Per-request timeout; the service answers 503 busy after ORDER_TIMEOUT
  // (3s by default), so this only catches a hung instance.
  requestTimeout: env('REQUEST_TIMEOUT', '15s'),
  // Send an Idempotency-Key with every order (one more write per order).
  idempotencyKeys: bool('IDEMPOTENCY_KEYS', false),
  // How long setup() waits for every instance's /readyz, in seconds.
  readyTimeout: int('READY_TIMEOUT', 30),
  // Labels for the summary only: what the runner started.
  strategy: env('STRATEGY', ''),
  backend: env('BACKEND', ''),
  // Where handleSummary writes: the JSON for the runner and a text copy of
  // the summary printed on stdout.
  summaryJSON: env('SUMMARY_JSON', 'summary.json'),
  summaryText: env('SUMMARY_TXT', ''),
});

if (config.baseURLs.length === 0) {
  throw new Error('BASE_URLS names no instance');
}
