package redislock

import "context"

// Test hooks: core calls them where a test needs to see a goroutine block
// or to stall it; export_test.go sets them. Unset, they cost an atomic load.

func (c *core) setRenewHook(f func(ctx context.Context, key string) error) {
	if f == nil {
		c.renewHook.Store(nil)
		return
	}
	c.renewHook.Store(&f)
}

func (c *core) setWaitHook(f func(key string)) {
	if f == nil {
		c.waitHook.Store(nil)
		return
	}
	c.waitHook.Store(&f)
}

func (c *core) setGrantHook(f func(key string)) {
	if f == nil {
		c.grantHook.Store(nil)
		return
	}
	c.grantHook.Store(&f)
}

// waiting tells the test hook that the slot owner for key is about to block.
func (c *core) waiting(key string) {
	if hook := c.waitHook.Load(); hook != nil {
		(*hook)(key)
	}
}
