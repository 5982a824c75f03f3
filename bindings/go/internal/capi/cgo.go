// Package capi is the SWIG-generated layer over zero.h (bindings/swig/zero.i); the build generates the rest of it.
// Use package zero, not this one.
package capi

// #cgo pkg-config: zero
import "C"
