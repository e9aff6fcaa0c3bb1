// Orders that come back: a sale whose orders are held (HOLD_TTL) until
// their buyer pays. Every buyer orders one unit; a winner pays
// (PAY_PERCENT), or else cancels (CANCEL_PERCENT of the others) or walks
// away and lets the hold lapse, and the unit goes back on sale for the
// buyers still waiting. A share of the buyers (TWICE_PERCENT) click twice
// at once, on two instances: with PER_USER_LIMIT=1 one of the two must be
// refused 409 limit_reached, never both accepted. A buyer told sold_out
// tries again after RETRY_PAUSE_MS, until the sale is over (every unit
// paid, as GET /admin/audit says) or RUN_SECONDS have passed.
//
//   go tool k6 run -e BASE_URLS=http://127.0.0.1:8080 -e STOCK=40 -e BUYERS=160 -e VUS=160 lifecycle.js
//
// The instances must run with HOLD_TTL (a few seconds) and PER_USER_LIMIT=1.
// Bounded: BUYERS buyers, RUN_SECONDS for the sale, and the executor's
// maxDuration a little beyond. teardown() checks the audit's consistency
// (every unit is available, held or paid, none counted twice); the run
// fails (exit 99) when it does not hold.
import { check, sleep } from 'k6';
import http from 'k6/http';
import { Counter, Gauge, Trend } from 'k6/metrics';

import { audit, startSale, waitReady } from './lib/api.js';
import { config } from './lib/config.js';
import { textSummary } from './lib/summary.js';

// 409 (sold out, limit reached) is the service working, as in flashsale.js.
http.setResponseCallback(http.expectedStatuses(200, 201, 409));

const orders = new Counter('orders'); // 201: a unit held for the buyer
const soldOut = new Counter('sold_out'); // 409 sold_out
const limitReached = new Counter('limit_reached'); // 409 limit_reached
const busy = new Counter('busy'); // 503
const errors = new Counter('errors'); // anything else, timeouts included
const secondOrders = new Counter('second_orders'); // the second of two orders sent at once
// Both of one buyer's two orders accepted: PER_USER_LIMIT=1 broken.
const limitBreached = new Counter('limit_breached');
const paid = new Counter('paid'); // pay answered 200
const payRefused = new Counter('pay_refused'); // pay answered anything else
const cancelled = new Counter('cancelled'); // cancel answered 200
const cancelRefused = new Counter('cancel_refused');
const abandoned = new Counter('abandoned'); // held and left to lapse
const gaveUp = new Counter('gave_up'); // still without a unit when the run's time ran out
const latency = new Trend('order_latency', true); // POST /orders, every answer
// Milliseconds since the sale started at which a pay succeeded: the
// maximum is when the last unit was paid.
const paidAt = new Trend('paid_at', true);
const answeredAt = new Trend('answered_at', true);
const auditGauges = {};
for (const f of ['initial', 'restocked', 'available', 'held', 'paid', 'returned', 'cancelled', 'expired']) {
  auditGauges[f] = new Gauge(`audit_${f}`);
}

export const options = {
  scenarios: {
    lifecycle: {
      executor: 'shared-iterations',
      vus: Math.max(1, Math.min(config.vus, config.buyers)),
      iterations: Math.max(1, config.buyers),
      // The buyers stop at RUN_SECONDS by themselves; this only bounds a
      // request that hangs.
      maxDuration: `${config.runSeconds + 15}s`,
      gracefulStop: '5s',
    },
  },
  thresholds: {
    'checks{group:::teardown}': ['rate==1'],
  },
  summaryTrendStats: ['avg', 'min', 'med', 'max', 'p(90)', 'p(95)', 'p(99)', 'count'],
  setupTimeout: `${config.readyTimeout + 30}s`,
  teardownTimeout: '30s',
  tags: { strategy: config.strategy || 'unknown', backend: config.backend || 'unknown' },
};

export function setup() {
  waitReady(config.baseURLs, config.readyTimeout);
  startSale(config.baseURLs[0], config.adminToken, config.sku, config.stock);
  const startedAt = Date.now();
  return { sku: config.sku, startedAt, deadline: startedAt + config.runSeconds * 1000 };
}

const json = { 'Content-Type': 'application/json' };
const orderTags = config.baseURLs.map((_, n) => ({ instance: `i${n + 1}`, name: 'POST /orders' }));
const instances = config.baseURLs.length;

// Per VU: once a VU has seen every unit paid, its later buyers leave at
// once; the audit is read at most every AUDIT_EVERY_MS (1 s) per VU, so
// that the waiting buyers do not load the service with audits.
let saleOver = false;
let lastAudit = 0;

function orderRequest(n, buyer) {
  return {
    method: 'POST',
    url: `${config.baseURLs[n % instances]}/orders`,
    body: `{"sku":${JSON.stringify(config.sku)},"quantity":1,"user_id":"${buyer}"}`,
    params: { headers: json, tags: orderTags[n % instances], timeout: config.requestTimeout },
  };
}

// outcome counts one answer to POST /orders and returns the order's id
// when it was accepted.
function outcome(res, data) {
  latency.add(res.timings.duration);
  answeredAt.add(Date.now() - data.startedAt);
  if (res.status === 201) {
    orders.add(1);
    try {
      return JSON.parse(res.body).order_id;
    } catch (e) {
      errors.add(1, { status: '201-unreadable' });
      return null;
    }
  }
  if (res.status === 409) {
    let code = '';
    try {
      code = JSON.parse(res.body).error.code;
    } catch (e) {
      // counted below as an error
    }
    if (code === 'sold_out') soldOut.add(1);
    else if (code === 'limit_reached') limitReached.add(1);
    else errors.add(1, { status: `409-${code}` });
    return null;
  }
  if (res.status === 503) busy.add(1);
  else errors.add(1, { status: String(res.status) });
  return null;
}

function settle(n, buyer, id, data) {
  const base = config.baseURLs[n % instances];
  const body = JSON.stringify({ user_id: buyer });
  const r = Math.random() * 100;
  if (r < config.payPercent) {
    const res = http.post(`${base}/orders/${id}/pay`, body, { headers: json, tags: { name: 'POST /orders/{id}/pay' }, responseType: 'none' });
    if (res.status === 200) {
      paid.add(1);
      paidAt.add(Date.now() - data.startedAt);
    } else {
      payRefused.add(1, { status: String(res.status) });
    }
  } else if (r < config.payPercent + ((100 - config.payPercent) * config.cancelPercent) / 100) {
    const res = http.post(`${base}/orders/${id}/cancel`, body, { headers: json, tags: { name: 'POST /orders/{id}/cancel' }, responseType: 'none' });
    if (res.status === 200) cancelled.add(1);
    else cancelRefused.add(1, { status: String(res.status) });
  } else {
    abandoned.add(1);
  }
}

// over reads the audit, at most every AUDIT_EVERY_MS per VU: the sale is
// over when every unit is paid.
function over(data) {
  if (saleOver) return true;
  const now = Date.now();
  if (now - lastAudit < config.auditEveryMs) return false;
  lastAudit = now;
  try {
    const a = audit(config.baseURLs[__VU % instances], config.adminToken, data.sku);
    saleOver = a.paid >= a.initial + (a.restocked || 0);
  } catch (e) {
    // An audit that failed says nothing: keep buying.
  }
  return saleOver;
}

export default function (data) {
  if (saleOver) return;
  const buyer = `lc-${__VU}-${__ITER}`;
  let twice = Math.random() * 100 < config.twicePercent;
  for (let attempt = 0; ; attempt++) {
    if (Date.now() >= data.deadline) {
      gaveUp.add(1);
      return;
    }
    const n = __VU + __ITER + attempt;
    let id = null;
    if (twice) {
      // The double click: two orders of one buyer at once, on two
      // instances. Once only: a buyer who lost both retries with one.
      twice = false;
      secondOrders.add(1);
      const ids = http.batch([orderRequest(n, buyer), orderRequest(n + 1, buyer)]).map((res) => outcome(res, data)).filter((x) => x);
      if (ids.length > 1) limitBreached.add(ids.length - 1);
      id = ids[0] || null;
    } else {
      const req = orderRequest(n, buyer);
      id = outcome(http.post(req.url, req.body, req.params), data);
    }
    if (id) {
      settle(n, buyer, id, data);
      return;
    }
    if (over(data)) return;
    // A person clicking again, not a synchronisation: the unit this
    // buyer waits for comes back when another buyer cancels or a hold
    // lapses.
    sleep(config.retryPauseMs / 1000);
  }
}

export function teardown(data) {
  const a = audit(config.baseURLs[0], config.adminToken, data.sku);
  for (const [f, g] of Object.entries(auditGauges)) g.add(a[f] || 0);
  check(a, {
    'the audit is consistent': (x) => x.consistent === true,
    'nothing oversold': (x) => x.available >= 0 && x.held + x.paid <= x.initial + (x.restocked || 0),
  });
}

export function handleSummary(data) {
  const title = `lifecycle ${config.backend}/${config.strategy}`.trim();
  const text = textSummary(data, title);
  const out = { stdout: text };
  out[config.summaryJSON] = JSON.stringify(data, null, 1);
  if (config.summaryText) out[config.summaryText] = text;
  return out;
}
