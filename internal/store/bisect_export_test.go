package store

// QDeferSiblings is exposed to the EXPLAIN check of the deferral (bisect_test.go).
const QDeferSiblings = qDeferSiblings
