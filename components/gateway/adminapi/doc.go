// Package adminapi is the contract of bcgw's admin API: the JSON bodies
// its calls take and answer, the files operators sign offline and submit
// through it (prepared commands and specs, batches, approver sets), and
// the client `bcgw` and the tests use. It holds no gateway state; the
// handlers are in package admin.
package adminapi
