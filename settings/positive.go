package settings

// PositiveOr is v, or def where v is not positive: an option left unset
// (zero, or nonsense below it) takes its default.
func PositiveOr[T ~int | ~int32 | ~int64 | ~float64](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}
