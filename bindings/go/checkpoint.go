package zero

import "libzero/internal/capi"

// SaveCheckpoint saves a sharded checkpoint as dir/tag and points dir/latest at it. Collective.
func (e *Engine) SaveCheckpoint(dir, tag string) error {
	if err := paths(dir, tag); err != nil {
		return err
	}
	return e.with(func(h uintptr) error {
		return call(func() error { return capi.Zero_save_checkpoint(h, dir, tag) })
	})
}

// LoadCheckpoint loads dir/tag (tag "": the latest), whatever rank count saved it. Collective.
func (e *Engine) LoadCheckpoint(dir, tag string) error {
	if err := paths(dir, tag); err != nil {
		return err
	}
	return e.with(func(h uintptr) error {
		return call(func() error { return capi.Zero_load_checkpoint(h, dir, tag) })
	})
}

func paths(dir, tag string) error {
	if err := cString(dir, "the checkpoint directory"); err != nil {
		return err
	}
	return cString(tag, "the checkpoint tag")
}
