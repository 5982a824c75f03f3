package zero

import "libzero/internal/capi"

// Version is the libzero library's version as major*10000 + minor*100 + patch.
func Version() int { return int(capi.Zero_get_version()) }
