package inventory

import "context"

// An affinity names what the work under a context is about: the SKU of an
// order, the lane of a batch of orders (internal/batched), the
// reservation's drain. A store over several servers that each take
// writes, the nodes of a Galera cluster, sends the work of one affinity
// through one server: two transactions that write one row through one
// node queue on its row lock, where through two nodes one of them would
// fail at certification and run again. It changes where work runs, never
// what it does.
type affinityKey struct{}

// WithAffinity returns ctx carrying key as its affinity.
func WithAffinity(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, affinityKey{}, key)
}

// AffinityOf is ctx's affinity, and whether it has one.
func AffinityOf(ctx context.Context) (string, bool) {
	key, ok := ctx.Value(affinityKey{}).(string)
	return key, ok
}

// Shard is which of n shards key falls in, by its FNV-1a hash: the same
// on every instance (batched's lanes, a Galera store's nodes).
func Shard(key string, n int) int {
	h := uint32(2166136261)
	for i := 0; i < len(key); i++ {
		h = (h ^ uint32(key[i])) * 16777619
	}
	return int(h % uint32(n))
}
