package keys

import "strings"

// BenchModelPrefix marks benchmark traffic: `kvdock bench` registers its
// workers under model names that start with it. The pool keeps such a
// model's objects apart (they never evict another model's, core/l1), the
// tiers never see them, and their lookups stay out of the insight figures.
// A model id from a hub or a path never starts with it: it has a colon,
// which neither allows. A peer that picks such a name only confines itself.
const BenchModelPrefix = "kvdock-bench:"

// IsBenchModel reports whether model is benchmark traffic.
func IsBenchModel(model string) bool { return strings.HasPrefix(model, BenchModelPrefix) }
