package chaos

import (
	"fmt"
	"html"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/anishathalye/porcupine"
)

// writeVisualization writes porcupine's HTML view of the lease histories,
// annotated with the nemesis windows and leader changes.
func writeVisualization(path string, eps float64, info porcupine.LinearizationInfo, evs []Event, end int64) error {
	var anns []porcupine.Annotation
	open := map[string]Event{}
	for _, e := range evs {
		switch {
		case e.Type == "leader":
			anns = append(anns, porcupine.Annotation{Tag: "leader", Start: e.Time, End: e.Time,
				Description: "leader " + e.Name, Details: e.Detail, BackgroundColor: "#cfe2ff"})
		case e.Type == "nemesis" && e.Phase == "start":
			open[e.Name+e.Detail] = e
		case e.Type == "nemesis" && e.Phase == "stop":
			s, ok := open[e.Name+e.Detail]
			if !ok {
				s = e
			}
			delete(open, e.Name+e.Detail)
			anns = append(anns, porcupine.Annotation{Tag: "nemesis", Start: s.Time, End: e.Time,
				Description: e.Name, Details: e.Detail, BackgroundColor: "#ffd6d6"})
		case e.Type == "nemesis":
			anns = append(anns, porcupine.Annotation{Tag: "nemesis", Start: e.Time, End: e.Time,
				Description: e.Name, Details: e.Detail + " " + e.Err, BackgroundColor: "#ffd6d6"})
		}
	}
	for _, s := range open {
		anns = append(anns, porcupine.Annotation{Tag: "nemesis", Start: s.Time, End: end,
			Description: s.Name, Details: s.Detail, BackgroundColor: "#ffd6d6"})
	}
	info.AddAnnotations(anns)
	return porcupine.VisualizePath(LeaseModel(eps), info, path)
}

// faultWindows pairs nemesis start and stop events.
type faultWindow struct {
	Name, Detail string
	Start, End   int64
}

func faultWindows(evs []Event, end int64) []faultWindow {
	var out []faultWindow
	open := map[string]int{}
	for _, e := range evs {
		if e.Type != "nemesis" {
			continue
		}
		k := e.Name + "|" + e.Detail
		switch e.Phase {
		case "start":
			open[k] = len(out)
			out = append(out, faultWindow{Name: e.Name, Detail: e.Detail, Start: e.Time, End: end})
		case "stop":
			if i, ok := open[k]; ok {
				out[i].End = e.Time
				delete(open, k)
			}
		default:
			out = append(out, faultWindow{Name: e.Name, Detail: e.Detail, Start: e.Time, End: e.Time})
		}
	}
	return out
}

// writeTimeline writes timeline.html (an SVG: one row per key with the
// holder windows as bars, fault windows shaded, leader changes as lines)
// and timeline.txt (the same as text).
func writeTimeline(dir string, ws []window, evs []Event, ops []Op, end int64) error {
	keys := []string{}
	rows := map[string][]window{}
	for _, w := range ws {
		if _, ok := rows[w.Key]; !ok {
			keys = append(keys, w.Key)
		}
		rows[w.Key] = append(rows[w.Key], w)
	}
	sort.Strings(keys)
	faults := faultWindows(evs, end)

	// Text.
	var t strings.Builder
	fmt.Fprintf(&t, "Holder windows (belief: acknowledged grant until release sent / deadline), %d keys, %d windows\n", len(keys), len(ws))
	for _, f := range faults {
		fmt.Fprintf(&t, "fault %-16s %8s - %8s  %s\n", f.Name, fmtT(f.Start), fmtT(f.End), f.Detail)
	}
	for _, e := range evs {
		if e.Type == "leader" {
			fmt.Fprintf(&t, "leader %-15s %8s  %s\n", e.Name, fmtT(e.Time), e.Detail)
		}
	}
	for _, k := range keys {
		fmt.Fprintf(&t, "\n%s\n", k)
		for _, w := range rows[k] {
			fmt.Fprintf(&t, "  %8s - %8s  worker %-2d fence %-6d %s (%s)\n", fmtT(w.Start), fmtT(w.End), w.Worker, w.Fence, w.LeaseID, w.EndReason)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "timeline.txt"), []byte(t.String()), 0o644); err != nil {
		return err
	}

	// SVG.
	const width, rowH, left = 1400.0, 18.0, 260.0
	scale := (width - left - 10) / float64(max(end, 1))
	x := func(ns int64) float64 { return left + float64(ns)*scale }
	height := float64(len(keys)+3)*rowH + 40
	var b strings.Builder
	fmt.Fprintf(&b, "<!doctype html><meta charset=utf-8><title>holder windows</title><body style=\"font:12px sans-serif\">\n")
	fmt.Fprintf(&b, "<p>One row per key; a bar is a client's belief that it holds the key (acknowledged grant until its release was sent or its own deadline). Overlapping bars in a row would be a double grant. Red: fault windows; blue lines: leader changes. Hover for details.</p>\n")
	fmt.Fprintf(&b, "<svg width=\"%.0f\" height=\"%.0f\" xmlns=\"http://www.w3.org/2000/svg\">\n", width, height)
	for _, f := range faults {
		w := x(f.End) - x(f.Start)
		if w < 2 {
			w = 2
		}
		fmt.Fprintf(&b, "<rect x=\"%.1f\" y=\"0\" width=\"%.1f\" height=\"%.0f\" fill=\"#ffd6d6\"><title>%s</title></rect>\n",
			x(f.Start), w, height, html.EscapeString(f.Name+" "+f.Detail+" "+fmtT(f.Start)+"-"+fmtT(f.End)))
	}
	for _, e := range evs {
		if e.Type == "leader" {
			fmt.Fprintf(&b, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"0\" y2=\"%.0f\" stroke=\"#3b6fd1\"><title>%s</title></line>\n",
				x(e.Time), x(e.Time), height, html.EscapeString("leader "+e.Name+" at "+fmtT(e.Time)))
		}
	}
	for r, k := range keys {
		y := float64(r+1) * rowH
		fmt.Fprintf(&b, "<text x=\"4\" y=\"%.0f\">%s</text>\n", y+12, html.EscapeString(truncate(k, 40)))
		for _, w := range rows[k] {
			wd := x(w.End) - x(w.Start)
			if wd < 1 {
				wd = 1
			}
			color := fmt.Sprintf("hsl(%d,60%%,55%%)", (w.Worker*47)%360)
			fmt.Fprintf(&b, "<rect x=\"%.1f\" y=\"%.0f\" width=\"%.1f\" height=\"%.0f\" fill=\"%s\" stroke=\"#333\" stroke-width=\"0.3\"><title>%s</title></rect>\n",
				x(w.Start), y+2, wd, rowH-4, color,
				html.EscapeString(fmt.Sprintf("%s worker %d fence %d %s-%s (%s)", w.LeaseID, w.Worker, w.Fence, fmtT(w.Start), fmtT(w.End), w.EndReason)))
		}
	}
	// Time axis.
	axisY := float64(len(keys)+2) * rowH
	for s := int64(0); s <= end; s += 5e9 {
		fmt.Fprintf(&b, "<text x=\"%.1f\" y=\"%.0f\">%ds</text>\n", x(s), axisY+12, s/1e9)
	}
	b.WriteString("</svg>\n")
	failed := 0
	for _, o := range ops {
		if o.Status == StatusInfo {
			failed++
		}
	}
	fmt.Fprintf(&b, "<p>%d operations, %d indeterminate.</p></body>\n", len(ops), failed)
	return os.WriteFile(filepath.Join(dir, "timeline.html"), []byte(b.String()), 0o644)
}
