// A short text summary for humans, written beside the JSON that the runner
// reads. (k6's own summary is replaced when handleSummary exists, and the
// jslib one would have to be vendored; this one prints only what matters
// here.)

function fmtNum(v, digits = 0) {
  if (v === undefined || v === null || Number.isNaN(v)) return '-';
  return Number(v).toFixed(digits);
}

function metric(data, name) {
  return (data.metrics[name] || {}).values || {};
}

export function textSummary(data, title) {
  const lines = [];
  const count = (n) => fmtNum(metric(data, n).count);
  lines.push(`== ${title} ==`);
  const dur = data.state ? data.state.testRunDurationMs / 1000 : 0;
  lines.push(`test run: ${fmtNum(dur, 1)}s (setup and teardown included)`);
  lines.push(`requests: ${count('http_reqs')}  orders (201): ${count('orders')}  sold out (409): ${count('sold_out')}  busy (503): ${count('busy')}  errors: ${count('errors')}`);
  if (data.metrics.paid) {
    // lifecycle.js
    lines.push(`paid: ${count('paid')}  cancelled: ${count('cancelled')}  left to lapse: ${count('abandoned')}  limit_reached: ${count('limit_reached')} of ${count('second_orders')} double clicks  both accepted: ${count('limit_breached')}  gave up: ${count('gave_up')}`);
  }
  const dropped = metric(data, 'dropped_iterations').count;
  if (dropped) lines.push(`dropped iterations (no free VU): ${fmtNum(dropped)}`);
  for (const name of ['order_latency', 'http_req_duration']) {
    const t = metric(data, name);
    if (t.med !== undefined) {
      lines.push(`${name}: p50=${fmtNum(t.med, 1)}ms p95=${fmtNum(t['p(95)'], 1)}ms p99=${fmtNum(t['p(99)'], 1)}ms max=${fmtNum(t.max, 1)}ms`);
    }
  }
  for (const name of ['audit_initial', 'audit_available', 'audit_ordered', 'audit_orders', 'audit_held', 'audit_paid', 'audit_returned', 'audit_cancelled', 'audit_expired']) {
    const g = metric(data, name);
    if (g.value !== undefined) lines.push(`${name}: ${fmtNum(g.value)}`);
  }
  const checks = (data.root_group && data.root_group.groups) || [];
  for (const g of checks) {
    for (const c of g.checks || []) {
      lines.push(`check ${g.name}: ${c.fails === 0 ? 'ok  ' : 'FAIL'} ${c.name} (${c.passes} passed, ${c.fails} failed)`);
    }
  }
  for (const [name, m] of Object.entries(data.metrics)) {
    for (const [expr, t] of Object.entries(m.thresholds || {})) {
      lines.push(`threshold ${name} ${expr}: ${t.ok ? 'ok' : 'CROSSED'}`);
    }
  }
  return lines.join('\n') + '\n';
}
