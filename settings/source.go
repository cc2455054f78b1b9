package settings

// SourceKind says which layer set a value.
type SourceKind int

// The layers, weakest first. The zero value is SourceDefault.
const (
	SourceDefault SourceKind = iota
	SourceFile
	SourceEnv
	SourceFlag
	SourceDashboard
)

// String names the kind: "default", "file", "env", "flag", "dashboard".
func (k SourceKind) String() string {
	switch k {
	case SourceDefault:
		return "default"
	case SourceFile:
		return "file"
	case SourceEnv:
		return "env"
	case SourceFlag:
		return "flag"
	case SourceDashboard:
		return "dashboard"
	}
	return "unknown"
}

// Source is where one value came from. Detail is "path:line" for a file,
// the variable name for env ("KVDOCK_L1_SIZE_GB"), the flag as typed
// ("--l1-size-gb") for a flag, and empty for default and dashboard.
type Source struct {
	Kind   SourceKind
	Detail string
}

// String is what messages print after "from": the detail when there is one,
// else the kind ("default", "dashboard").
func (s Source) String() string {
	if s.Detail != "" {
		return s.Detail
	}
	return s.Kind.String()
}
