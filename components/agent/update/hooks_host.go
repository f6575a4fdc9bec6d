//go:build !fakehw

package update

func testHooks(*Slots) {}
