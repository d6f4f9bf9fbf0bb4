// Package model holds the Promela model of batcherd's coordination protocol
// (batcherd.pml) and the test that model-checks it with spin. docs/MODEL.md maps each
// step of the model to the store method or scanner step it stands for; `make model`
// runs the full check, and this package's test a short slice of it.
package model
