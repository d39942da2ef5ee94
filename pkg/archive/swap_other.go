//go:build !linux

package archive

func swap(staged, target, previous string) error { return swapByRename(staged, target, previous) }
