package bentotest

// BusyHint is what Drain's failure says when consumers stay busy.
const BusyHint = busyHint
