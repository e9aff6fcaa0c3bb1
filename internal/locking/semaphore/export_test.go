package semaphore

// EnterScript is the package's enter script, for tests that run its
// steps in a chosen order (many waiters' first asks in one pipeline).
var EnterScript = enter

// KeysOf returns name's keys: holders, queue, seen, ticket, channel.
func (s *Semaphore) KeysOf(name string) []string { return s.keys(name) }
