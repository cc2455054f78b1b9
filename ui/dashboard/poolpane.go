package dashboard

import (
	"fmt"

	"charm.land/lipgloss/v2"

	"kvdock/settings"
)

// poolPane is the L1 pool: the segment and what REGISTER advertises, usage,
// locks, misses, host memory, prefault, eviction, transfer counters, the
// usage history and the what-if estimate for other pool sizes; it scrolls
// when they do not fit.
type poolPane struct{ scrollPane }

func (p *poolPane) View() string { return p.show(p.lines(p.w), p.h) }

func (p *poolPane) lines(w int) []string {
	pc := p.pc
	s := pc.snap
	d := s.Pool.Decision
	var lines []string
	if d.Shared && d.Segment != "" {
		lines = append(lines, pc.st.Bold.Render("Segment   ")+d.Segment+"  (SHM: workers attach it)")
	} else if d.Private != "" {
		lines = append(lines, pc.st.Bold.Render("Segment   ")+d.Private+"  (private, not advertised)")
	} else {
		reason := d.Reason
		if reason == "" {
			reason = s.Shm.Reason
		}
		lines = append(lines, pc.st.Bold.Render("Segment   ")+pc.st.Warn.Render("anonymous")+" (SHM off: "+reason+")")
	}
	if (d.Shared || d.Private != "") && d.Reason != "" {
		lines = append(lines, "          "+d.Reason)
	}
	adv := "shm_name \"\" pool_size 0 (pickle fallback)"
	if s.Shm.Shared() {
		adv = fmt.Sprintf("shm_name %q pool_size %d", s.Shm.ShmName, s.Shm.PoolSize)
	}
	lines = append(lines, pc.st.Bold.Render("Register  ")+"replies "+adv)

	pct := percent(float64(s.Pool.UsedBytes), float64(s.Pool.Size))
	nums := fmt.Sprintf(" %s / %s (%.1f%%)", settings.BytesText(s.Pool.UsedBytes), settings.BytesText(s.Pool.Size), pct)
	barW := max(10, min(50, w-10-lipgloss.Width(nums)))
	lines = append(lines,
		"",
		pc.st.Bold.Render("Usage     ")+bar(pc.st, barW, pct)+nums,
		// Usable bytes are those a LOOKUP can reach: a chunk whose
		// previous chunk was evicted is resident but never served.
		pc.st.Bold.Render("Usable    ")+fmt.Sprintf("%s of %s resident (%.1f%%)",
			settings.BytesText(s.Pool.UsableBytes), settings.BytesText(s.Pool.ResidentBytes), 100*s.Pool.UsableRatio()),
		fmt.Sprintf("%s%d   %s%d   %s%d",
			pc.st.Bold.Render("Objects   "), s.Pool.Objects,
			pc.st.Bold.Render("Evictions "), s.Pool.Evictions,
			pc.st.Bold.Render("Alloc failures "), s.Pool.AllocFailures),
		fmt.Sprintf("%s%d write, %d read   reads %d hit / %d miss",
			pc.st.Bold.Render("Locked    "), s.Pool.WriteLocked, s.Pool.ReadLocked, s.Pool.ReadHits, s.Pool.ReadMisses),
		pc.missLine(w),
		p.hostLine(),
		pc.hostRAMLine(),
		p.prefaultLine(w),
		"",
		fmt.Sprintf("%s%s, watermark %.2f, ratio %.2f   TTL write %s, read %s",
			pc.st.Bold.Render("Eviction  "), s.Pool.Policy, s.Pool.Watermark, s.Pool.Ratio,
			durationText(s.Pool.WriteTTL), durationText(s.Pool.ReadTTL)),
		fmt.Sprintf("%s%d pending writes, %d pending reads, %d no-space, %d rejected, %d fallbacks",
			pc.st.Bold.Render("Transfer  "), s.Transfer.PendingWrites, s.Transfer.PendingReads,
			s.Transfer.NoSpace, s.Transfer.Rejected, s.Transfer.Fallbacks),
		"",
	)
	lines = append(lines, pc.poolHistory(w)...)
	return append(lines, pc.whatIfLines(w, whatIfChartRows)...)
}

// hostLine is the memory the pool draws on: /dev/shm for a shared or a
// private segment, the host's available memory for anonymous memory.
func (p *poolPane) hostLine() string {
	pc := p.pc
	s := pc.snap
	if d := s.Pool.Decision; d.Shared || d.Private != "" {
		return pc.st.Bold.Render("/dev/shm  ") + settings.BytesText(s.Pool.ShmFree) + " free"
	}
	return pc.st.Bold.Render("Host mem  ") + settings.BytesText(s.Pool.HostAvailable) + " available (MemAvailable; SHM off: the pool is anonymous memory)"
}

// prefaultLine shows the background prefault's progress.
func (p *poolPane) prefaultLine(w int) string {
	pc := p.pc
	pool := pc.snap.Pool
	label := pc.st.Bold.Render("Prefault  ")
	switch {
	case !pc.snap.Config.L1.Prefault:
		return label + "off (pages are faulted in by the first writes)"
	case pool.Size <= 0:
		return label + "- (no pool)"
	case pool.Size > 0 && pool.Prefaulted >= pool.Size:
		return label + "done, " + settings.BytesText(pool.Size) + " resident"
	}
	pct := percent(float64(pool.Prefaulted), float64(pool.Size))
	nums := fmt.Sprintf(" %s / %s (%.1f%%) in progress", settings.BytesText(pool.Prefaulted), settings.BytesText(pool.Size), pct)
	barW := max(10, min(50, w-10-lipgloss.Width(nums)))
	return label + bar(pc.st, barW, pct) + nums
}
