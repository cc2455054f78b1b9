//go:build linux && cgo

package gpu

import "github.com/NVIDIA/go-nvml/pkg/nvml"

// systemLib binds the adapter to the system's libnvidia-ml.so.1 through
// go-nvml. Its own library instance (not go-nvml's global one) keeps all
// state with the Source.
func systemLib() lib { return &goNVML{l: nvml.New()} }

type goNVML struct{ l nvml.Interface }

// check converts a return code. Init failures carry no message: NVML's
// ErrorString is not to be called when Init failed.
func check(op string, r nvml.Return, live bool) error {
	if r == nvml.SUCCESS {
		return nil
	}
	e := &nvmlError{Op: op, Code: int(r)}
	if live {
		e.Msg = r.Error()
	}
	return e
}

func (g *goNVML) Init() error     { return check("init", g.l.Init(), false) }
func (g *goNVML) Shutdown() error { return check("shutdown", g.l.Shutdown(), true) }

func (g *goNVML) HasSymbol(name string) bool {
	return g.l.Extensions().LookupSymbol(name) == nil
}

func (g *goNVML) DriverVersion() (string, error) {
	v, r := g.l.SystemGetDriverVersion()
	return v, check("driver version", r, true)
}

func (g *goNVML) DeviceCount() (int, error) {
	n, r := g.l.DeviceGetCount()
	return n, check("device count", r, true)
}

func (g *goNVML) Device(index int) (device, error) {
	d, r := g.l.DeviceGetHandleByIndex(index)
	if err := check("device handle", r, true); err != nil {
		return nil, err
	}
	return goDevice{d}, nil
}

type goDevice struct{ d nvml.Device }

func (g goDevice) Name() (string, error) {
	v, r := g.d.GetName()
	return v, check("name", r, true)
}

func (g goDevice) UUID() (string, error) {
	v, r := g.d.GetUUID()
	return v, check("uuid", r, true)
}

func (g goDevice) MemoryInfo() (used, total uint64, err error) {
	m, r := g.d.GetMemoryInfo()
	return m.Used, m.Total, check("memory info", r, true)
}

func (g goDevice) MemoryInfoV2() (used, total uint64, err error) {
	m, r := g.d.GetMemoryInfo_v2()
	return m.Used, m.Total, check("memory info v2", r, true)
}

func (g goDevice) Utilization() (uint32, error) {
	u, r := g.d.GetUtilizationRates()
	return u.Gpu, check("utilization", r, true)
}

func (g goDevice) ComputeProcesses() ([]procInfo, error) {
	ps, r := g.d.GetComputeRunningProcesses()
	return procs(ps), check("compute processes", r, true)
}

func (g goDevice) GraphicsProcesses() ([]procInfo, error) {
	ps, r := g.d.GetGraphicsRunningProcesses()
	return procs(ps), check("graphics processes", r, true)
}

func procs(ps []nvml.ProcessInfo) []procInfo {
	out := make([]procInfo, len(ps))
	for i, p := range ps {
		out[i] = procInfo{PID: p.Pid, UsedMem: p.UsedGpuMemory}
	}
	return out
}
