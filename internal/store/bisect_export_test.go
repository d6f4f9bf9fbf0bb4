package store

// The deferral and resume statements are exposed to the EXPLAIN check of the deferral (bisect_test.go).
const (
	QDeferSiblings = qDeferSiblings
	QPartsWaiting  = qPartsWaiting
	QDeferredOf    = qDeferredOf
)
