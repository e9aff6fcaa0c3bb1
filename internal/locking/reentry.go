package locking

import "context"

// Re-entrancy through the context, the same in every backend: a lease's
// context carries its hold, and an Acquire of the same name on the same
// locker under that context finds it and re-enters instead of waiting for
// itself. The owner (the locker) is part of the key: a context from one
// locker's lease never re-enters another locker's lock of the same name.

type heldKey struct {
	owner any
	name  string
}

// WithHold returns ctx marked with hold, owner's hold of name.
func WithHold[H any](ctx context.Context, owner any, name string, hold H) context.Context {
	return context.WithValue(ctx, heldKey{owner, name}, hold)
}

// HoldOf returns owner's hold of name that ctx carries, if any.
func HoldOf[H any](ctx context.Context, owner any, name string) (H, bool) {
	h, ok := ctx.Value(heldKey{owner, name}).(H)
	return h, ok
}
