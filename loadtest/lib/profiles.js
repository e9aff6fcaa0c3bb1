// Load profiles. Both place one order per iteration; they differ in who
// decides when the next order comes.

// burst: everyone clicks at once. BUYERS buyers share VUS virtual users, as
// fast as the service answers (a closed model): several times more buyers
// than units, so the sale sells out under contention and the rest must get
// a clean 409.
export function burst(c) {
  return {
    burst: {
      executor: 'shared-iterations',
      vus: Math.max(1, Math.min(c.vus, c.buyers)),
      iterations: Math.max(1, c.buyers),
      maxDuration: c.maxDuration,
      gracefulStop: '5s',
    },
  };
}

// steady: an open model. RATE orders start every second for DURATION
// whatever the service does; when it cannot keep up, orders pile up in
// flight until MAX_VUS, and the ones that find no free VU are counted in
// dropped_iterations instead of silently slowing the load down.
export function steady(c) {
  return {
    steady: {
      executor: 'constant-arrival-rate',
      rate: Math.max(1, c.rate),
      timeUnit: '1s',
      duration: c.duration,
      // All VUs are made before the start: creating VUs mid-run costs CPU
      // that the 2-core machine would take from the service.
      preAllocatedVUs: c.maxVUs,
      maxVUs: c.maxVUs,
      gracefulStop: '5s',
    },
  };
}

// healthz: as many requests as k6 can push through VUS connections for
// DURATION, to a route that does no work: the ceiling of the load
// generator and the HTTP stack on this machine.
export function healthz(c) {
  return {
    healthz: {
      executor: 'constant-vus',
      vus: Math.max(1, c.vus),
      duration: c.duration,
      gracefulStop: '2s',
    },
  };
}

const profiles = { burst, steady, healthz };

export function profile(c) {
  const p = profiles[c.scenario];
  if (!p) {
    throw new Error(`SCENARIO=${c.scenario} is not one of ${Object.keys(profiles).join(', ')}`);
  }
  return p(c);
}
