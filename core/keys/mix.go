package keys

// Mix64 is splitmix64's finaliser: it spreads every bit of x over the
// result. A chunk digest is uniform already; the tables and samplers keyed by
// one mix the digest's first word with the rest of the key's identity
// through it instead of hashing a string on the hot path.
func Mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
