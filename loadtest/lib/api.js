// The service's routes, as the scripts call them. Admin calls fail the
// setup or teardown loudly: a sale that did not start must not be measured.
import http from 'k6/http';
import { sleep } from 'k6';

const json = { 'Content-Type': 'application/json' };

function admin(token) {
  return { ...json, Authorization: `Bearer ${token}` };
}

// waitReady polls every instance's /readyz until all answer 200, or throws
// after timeoutSec seconds.
export function waitReady(urls, timeoutSec) {
  const deadline = Date.now() + timeoutSec * 1000;
  for (const url of urls) {
    for (;;) {
      const res = http.get(`${url}/readyz`, { timeout: '2s', tags: { name: 'GET /readyz' } });
      if (res.status === 200) break;
      if (Date.now() > deadline) {
        throw new Error(`${url}/readyz answered ${res.status || res.error} for ${timeoutSec}s`);
      }
      // Nothing to wait on but time: the instance is starting.
      sleep(0.2);
    }
  }
}

// startSale puts n units of sku on sale, which also deletes its orders.
export function startSale(url, token, sku, n) {
  const res = http.put(`${url}/admin/stock/${encodeURIComponent(sku)}`, JSON.stringify({ available: n }), {
    headers: admin(token),
    tags: { name: 'PUT /admin/stock' },
  });
  if (res.status !== 200) {
    throw new Error(`starting the sale of ${n} ${sku}: ${res.status} ${res.body}`);
  }
}

// audit reads the sale's bookkeeping: {sku, initial, available, ordered,
// orders, consistent}.
export function audit(url, token, sku) {
  const res = http.get(`${url}/admin/audit/${encodeURIComponent(sku)}`, {
    headers: admin(token),
    tags: { name: 'GET /admin/audit' },
  });
  if (res.status !== 200) {
    throw new Error(`reading the audit of ${sku}: ${res.status} ${res.body}`);
  }
  return res.json();
}

// order places one order; body is its JSON text. The answer's body is not read (responseType none): the
// status says everything the counters need, and parsing thousands of
// bodies would take CPU from the service on a small machine.
export function order(url, body, tags, timeout, idempotencyKey) {
  const headers = idempotencyKey ? { ...json, 'Idempotency-Key': idempotencyKey } : json;
  return http.post(`${url}/orders`, body, {
    headers,
    tags,
    timeout,
    responseType: 'none',
  });
}
