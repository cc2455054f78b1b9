package dashboard

import (
	"fmt"
	"strings"

	"charm.land/lipgloss/v2"

	"kvdock/settings"
)

// gpuPane is GPU memory as NVML reports it: each device's used/total and
// its processes, registered workers marked; why not, when NVML is absent.
type gpuPane struct{ scrollPane }

func (p *gpuPane) View() string { return p.show(p.lines(p.w), p.h) }

func (p *gpuPane) lines(w int) []string {
	pc := p.pc
	g := pc.snap.GPU
	if !g.Available {
		reason := g.Reason
		if reason == "" {
			reason = "no reading yet"
		}
		// The source's reason already says "NVML unavailable: …" when NVML
		// is the cause; other reasons get the label here.
		reason, _ = strings.CutPrefix(reason, "NVML unavailable: ")
		return []string{pc.st.Warn.Render("NVML unavailable") + ": " + reason, "", pc.hostRAMLine()}
	}
	workers := map[int64]bool{}
	for _, c := range pc.snap.Contexts {
		workers[c.InstanceID] = true
	}
	var lines []string
	head := "Driver " + g.Driver
	if g.Err != "" {
		head += "  " + pc.st.Bad.Render("error: "+g.Err)
	}
	lines = append(lines, head, pc.hostRAMLine())
	for _, d := range g.Devices {
		pct := percent(float64(d.MemUsed), float64(d.MemTotal))
		nums := fmt.Sprintf(" %s / %s (%.1f%%)", settings.BytesText(int64(d.MemUsed)), settings.BytesText(int64(d.MemTotal)), pct)
		util := "util n/a"
		if d.Util >= 0 {
			util = fmt.Sprintf("util %d%%", d.Util)
		}
		title := fmt.Sprintf("GPU %d %s", d.Index, d.Name)
		barW := max(10, min(40, w-lipgloss.Width(title)-lipgloss.Width(nums)-len(util)-4))
		lines = append(lines, "", pc.st.Bold.Render(title)+" "+bar(pc.st, barW, pct)+nums+"  "+util)
		if len(d.Processes) == 0 {
			lines = append(lines, pc.st.Faint.Render("  no processes"))
			continue
		}
		lines = append(lines, pc.st.Header.Render(fmt.Sprintf("  %-9s %10s  %-4s %s", "PID", "MEMORY", "KIND", "KVDOCK")))
		for _, p := range d.Processes {
			mem := "n/a"
			if p.MemKnown {
				mem = settings.BytesText(int64(p.MemUsed))
			}
			mark := ""
			if workers[int64(p.PID)] {
				mark = pc.st.OK.Render("worker") + " (registered instance)"
			}
			lines = append(lines, fmt.Sprintf("  %-9d %10s  %-4s %s", p.PID, mem, p.Kind, mark))
		}
	}
	return lines
}
