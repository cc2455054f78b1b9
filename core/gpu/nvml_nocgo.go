//go:build !linux || !cgo

package gpu

import "errors"

// systemLib without cgo (or off Linux) cannot reach NVML: Init fails and
// NewNVML reports why.
func systemLib() lib { return noLib{} }

type noLib struct{}

var errNoCgo = errors.New("kvdock was built without cgo (or not for Linux)")

func (noLib) Init() error                    { return errNoCgo }
func (noLib) Shutdown() error                { return errNoCgo }
func (noLib) HasSymbol(string) bool          { return false }
func (noLib) DriverVersion() (string, error) { return "", errNoCgo }
func (noLib) DeviceCount() (int, error)      { return 0, errNoCgo }
func (noLib) Device(int) (device, error)     { return nil, errNoCgo }
