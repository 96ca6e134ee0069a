package bench

import (
	"fmt"
	"html"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Chart geometry, in SVG user units.
const (
	chartW      = 1080
	chartLeft   = 80  // left edge of the plots
	chartRight  = 720 // right edge of the plots; the legend is to its right
	curveTop    = 60
	curveBottom = 380
	barsTop     = 450
	barsBottom  = 650
	chartH      = 700
)

// chartColors are the series' colours, in the results' order (distinct for
// most colour blindness: the Okabe–Ito palette, then greys).
var chartColors = []string{"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442", "#777777", "#BBBBBB"}

// WriteChart draws the results of one workload as an SVG image: the wait
// distribution of every subject as a percentile curve on a log time axis,
// and below it the grants of every worker as bars, one colour per subject.
func WriteChart(w io.Writer, workload string, results []Result) error {
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", chartW, chartH, chartW, chartH)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", chartW, chartH)
	fmt.Fprintf(&b, `<text x="%d" y="24" font-size="16" font-weight="bold">%s</text>`+"\n", chartLeft, esc(workload))
	curvePanel(&b, results)
	barPanel(&b, results)
	legend(&b, results)
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteCharts writes one chart (WriteChart) per workload of r into dir,
// named prefix, the workload's label and ".svg", and returns their paths.
func (r *Report) WriteCharts(dir, prefix string) ([]string, error) {
	var (
		order  []string
		groups = map[string][]Result{}
	)
	for _, x := range r.Results {
		if groups[x.Workload] == nil {
			order = append(order, x.Workload)
		}
		groups[x.Workload] = append(groups[x.Workload], x)
	}
	var paths []string
	for _, wl := range order {
		var b strings.Builder
		if err := WriteChart(&b, wl, groups[wl]); err != nil {
			return paths, err
		}
		p := filepath.Join(dir, prefix+fileSafe(wl)+".svg")
		if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
			return paths, err
		}
		paths = append(paths, p)
	}
	return paths, nil
}

// fileSafe returns s with µ as u and anything but letters, digits, '.',
// '_' and '-' as '-'.
func fileSafe(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r == 'µ':
			return 'u'
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '_', r == '-':
			return r
		}
		return '-'
	}, s)
}

// esc escapes s for SVG text and attributes.
func esc(s string) string { return html.EscapeString(s) }

// nines is a quantile's place on the curve's x axis: 0 at p0, 1 at p90,
// 2 at p99, 3 at p99.9.
func nines(q float64) float64 { return -math.Log10(max(1-q, 1e-9)) }

// curvePanel draws wait against quantile: x the quantile on a nines scale,
// y the wait on a log scale from 1 µs (waits below it are drawn at it).
func curvePanel(b *strings.Builder, results []Result) {
	xmax := 3.0
	lo, hi := time.Microsecond, 10*time.Microsecond
	for _, r := range results {
		for _, p := range r.WaitCurve {
			if p.Q < 1 {
				xmax = max(xmax, math.Ceil(nines(p.Q)))
			}
			hi = max(hi, p.Wait)
		}
	}
	xmax = min(xmax, 6)
	decades := math.Ceil(math.Log10(float64(hi) / float64(lo)))
	x := func(q float64) float64 {
		return chartLeft + (chartRight-chartLeft)*min(nines(q), xmax)/xmax
	}
	y := func(d time.Duration) float64 {
		v := math.Log10(float64(max(d, lo))/float64(lo)) / decades
		return curveBottom - (curveBottom-curveTop)*v
	}
	fmt.Fprintf(b, `<text x="%d" y="%d" font-weight="bold">Wait for the lock (Lock call to return), by percentile of grants</text>`+"\n", chartLeft, curveTop-12)
	// y ticks: every decade.
	for k := 0.0; k <= decades; k++ {
		d := time.Duration(float64(lo) * math.Pow(10, k))
		yy := y(d)
		fmt.Fprintf(b, `<line class="ytick" x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", chartLeft, chartRight, yy, yy)
		fmt.Fprintf(b, `<text class="ytick-label" x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", chartLeft-6, yy+4, durLabel(d))
	}
	// x ticks: p0, p50, p90, p99, ...
	ticks := []struct {
		q     float64
		label string
	}{{0, "p0"}, {0.5, "p50"}}
	for k := 1.0; k <= xmax; k++ {
		ticks = append(ticks, struct {
			q     float64
			label string
		}{1 - math.Pow(10, -k), "p" + strings.TrimSuffix(fmt.Sprintf("%.*f", max(int(k)-2, 0), 100*(1-math.Pow(10, -k))), ".")})
	}
	for _, t := range ticks {
		xx := x(t.q)
		fmt.Fprintf(b, `<line class="xtick" x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#ddd"/>`+"\n", xx, xx, curveTop, curveBottom)
		fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", xx, curveBottom+16, t.label)
	}
	axes(b, curveTop, curveBottom)
	fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="middle">percentile of grants (log scale of 1 − p)</text>`+"\n", (chartLeft+chartRight)/2, curveBottom+34)
	fmt.Fprintf(b, `<text transform="translate(18 %d) rotate(-90)" text-anchor="middle">wait (log scale)</text>`+"\n", (curveTop+curveBottom)/2)
	for i, r := range results {
		var pts []string
		for _, p := range r.WaitCurve {
			q := p.Q
			if q == 1 { // the longest wait: one step past the last quantile
				if len(pts) == 0 {
					continue
				}
				q = 1 - math.Pow(10, -min(nines(r.WaitCurve[max(len(r.WaitCurve)-2, 0)].Q)+0.125, xmax))
			}
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(q), y(p.Wait)))
		}
		fmt.Fprintf(b, `<polyline class="series" data-subject="%s" fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n",
			esc(r.Subject), color(i), strings.Join(pts, " "))
	}
}

// barPanel draws the grants of each worker, grouped by worker.
func barPanel(b *strings.Builder, results []Result) {
	workers, most := 0, 1
	for _, r := range results {
		workers = max(workers, len(r.GrantsPerWorker))
		for _, g := range r.GrantsPerWorker {
			most = max(most, g)
		}
	}
	fmt.Fprintf(b, `<text x="%d" y="%d" font-weight="bold">Grants per worker (even bars: a fair lock)</text>`+"\n", chartLeft, barsTop-12)
	top := niceCeil(most)
	y := func(v int) float64 { return barsBottom - float64(barsBottom-barsTop)*float64(v)/float64(top) }
	for k := 0; k <= 4; k++ {
		v := top * k / 4
		yy := y(v)
		fmt.Fprintf(b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", chartLeft, chartRight, yy, yy)
		fmt.Fprintf(b, `<text x="%d" y="%.1f" text-anchor="end">%d</text>`+"\n", chartLeft-6, yy+4, v)
	}
	axes(b, barsTop, barsBottom)
	fmt.Fprintf(b, `<text transform="translate(18 %d) rotate(-90)" text-anchor="middle">grants</text>`+"\n", (barsTop+barsBottom)/2)
	fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="middle">worker</text>`+"\n", (chartLeft+chartRight)/2, barsBottom+34)
	if workers == 0 || len(results) == 0 {
		return
	}
	group := float64(chartRight-chartLeft) / float64(workers)
	bar := group * 0.8 / float64(len(results))
	for wk := range workers {
		gx := chartLeft + group*float64(wk)
		fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="middle">%d</text>`+"\n", gx+group/2, barsBottom+16, wk+1)
		for i, r := range results {
			if wk >= len(r.GrantsPerWorker) {
				continue
			}
			v := r.GrantsPerWorker[wk]
			fmt.Fprintf(b, `<rect class="bar" data-subject="%s" x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s, worker %d: %d grants</title></rect>`+"\n",
				esc(r.Subject), gx+group*0.1+bar*float64(i), y(v), bar, float64(barsBottom)-y(v), color(i), esc(r.Subject), wk+1, v)
		}
	}
}

// legend names each subject's colour, with its grants/s and Jain index.
func legend(b *strings.Builder, results []Result) {
	fmt.Fprintf(b, `<g class="legend"><text x="%d" y="%d" font-weight="bold">subject: grants/s, Jain</text>`+"\n", chartRight+20, curveTop-12)
	for i, r := range results {
		yy := curveTop + 6 + 22*i
		fmt.Fprintf(b, `<rect x="%d" y="%d" width="14" height="14" fill="%s"/>`+"\n", chartRight+20, yy, color(i))
		fmt.Fprintf(b, `<text class="legend-entry" x="%d" y="%d">%s: %.0f, %.3f</text>`+"\n", chartRight+40, yy+12, esc(r.Subject), r.Throughput, r.Jain)
	}
	b.WriteString("</g>\n")
}

// axes draws the left and bottom axis lines of a panel.
func axes(b *strings.Builder, top, bottom int) {
	fmt.Fprintf(b, `<path d="M%d %d V%d H%d" fill="none" stroke="#333"/>`+"\n", chartLeft, top, bottom, chartRight)
}

func color(i int) string { return chartColors[i%len(chartColors)] }

// durLabel formats a power of ten of time as 1 µs, 10 ms, 1 s, ...
func durLabel(d time.Duration) string {
	switch {
	case d < time.Millisecond:
		return fmt.Sprintf("%d µs", d/time.Microsecond)
	case d < time.Second:
		return fmt.Sprintf("%d ms", d/time.Millisecond)
	default:
		return fmt.Sprintf("%d s", d/time.Second)
	}
}

// niceCeil returns the least of 1, 2, 4, 5 or 8 times a power of ten, and at
// least 4, that is at least v.
func niceCeil(v int) int {
	v = max(v, 4)
	for p := 1; ; p *= 10 {
		for _, m := range []int{1, 2, 4, 5, 8, 10} { // quarters stay whole
			if m*p >= v {
				return m * p
			}
		}
	}
}
