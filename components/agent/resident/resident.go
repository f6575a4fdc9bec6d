// Package resident lets a long-running process give back the pages of its
// own code and read-only data that only its start touched. Every
// package's init and the start-up path fault in pages of the binary's text
// and rodata, and the kernel maps the pages around each fault too, so an
// idle agent kept nearly all of its code mapped (docs/decisions.md). These
// pages are clean copies of the binary in the page cache: unmapping them
// (madvise MADV_DONTNEED) loses nothing, and a page used again is mapped
// again from the page cache on its next touch.
package resident
