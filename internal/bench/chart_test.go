package bench

import (
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// chartResults are three subjects' results on one workload: waits from
// 3 µs to 2 s, as a fair lock and two barging ones give them.
func chartResults() []Result {
	var out []Result
	for i, s := range []string{"dlock", "raw", "peer <&>"} {
		waits := make([]time.Duration, 5000)
		for k := range waits {
			waits[k] = time.Duration(3+k*(i*i*80+1)) * time.Microsecond
		}
		out = append(out, Result{Subject: s, Workload: "hot-8w-cs100µs", Throughput: 3000, Jain: 0.99,
			GrantsPerWorker: []int{100 * (i + 1), 90, 110, 100, 95, 105, 100, 100}, WaitCurve: curve(waits)})
	}
	return out
}

// svgElement is an element of a chart, with the attributes the tests read.
type svgElement struct {
	name  string
	attrs map[string]string
	text  string
}

// parseSVG decodes a chart with encoding/xml, failing on malformed XML, and
// returns its elements in document order.
func parseSVG(t *testing.T, data string) []svgElement {
	t.Helper()
	dec := xml.NewDecoder(strings.NewReader(data))
	var (
		out   []svgElement
		stack []int
		root  string
	)
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("chart is not well-formed XML: %v\n%s", err, data)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			if root == "" {
				root = tok.Name.Space + " " + tok.Name.Local
			}
			e := svgElement{name: tok.Name.Local, attrs: map[string]string{}}
			for _, a := range tok.Attr {
				e.attrs[a.Name.Local] = a.Value
			}
			stack = append(stack, len(out))
			out = append(out, e)
		case xml.EndElement:
			stack = stack[:len(stack)-1]
		case xml.CharData:
			if len(stack) > 0 {
				out[stack[len(stack)-1]].text += string(tok)
			}
		}
	}
	if root != "http://www.w3.org/2000/svg svg" {
		t.Fatalf("root element %q, want svg in the SVG namespace", root)
	}
	return out
}

func TestWriteChartDrawsOneSeriesPerSubjectOnALogAxis(t *testing.T) {
	results := chartResults()
	var b strings.Builder
	if err := WriteChart(&b, "hot-8w-cs100µs", results); err != nil {
		t.Fatal(err)
	}
	els := parseSVG(t, b.String())

	var series, legend, bars, yticks []string
	for _, e := range els {
		switch {
		case e.attrs["class"] == "series":
			series = append(series, e.attrs["data-subject"])
			if n := len(strings.Fields(e.attrs["points"])); n < len(results[0].WaitCurve) {
				t.Errorf("%s: %d points, want %d", e.attrs["data-subject"], n, len(results[0].WaitCurve))
			}
		case e.attrs["class"] == "legend-entry":
			legend = append(legend, e.text)
		case e.attrs["class"] == "bar":
			bars = append(bars, e.attrs["data-subject"])
		case e.attrs["class"] == "ytick-label":
			yticks = append(yticks, e.text)
		}
	}
	want := []string{"dlock", "raw", "peer <&>"}
	if !slices.Equal(series, want) {
		t.Errorf("series %q, want one per subject: %q", series, want)
	}
	if len(legend) != len(want) {
		t.Errorf("legend %q, want one entry per subject", legend)
	}
	for i, s := range want {
		if !strings.HasPrefix(legend[i], s+":") {
			t.Errorf("legend entry %d %q, want it to name %q", i, legend[i], s)
		}
	}
	if len(bars) != 8*len(want) {
		t.Errorf("%d bars, want 8 workers × %d subjects", len(bars), len(want))
	}
	// Waits from 3 µs to about 2 s: a tick at every decade, 1 µs to 10 s.
	wantTicks := []string{"1 µs", "10 µs", "100 µs", "1 ms", "10 ms", "100 ms", "1 s", "10 s"}
	if !slices.Equal(yticks, wantTicks) {
		t.Errorf("wait axis ticks %q, want the decades %q", yticks, wantTicks)
	}
	// The decades are evenly spaced: a log axis.
	var ys []float64
	for _, e := range els {
		if e.attrs["class"] == "ytick" {
			var y float64
			if _, err := fmt.Sscan(e.attrs["y1"], &y); err != nil {
				t.Fatal(err)
			}
			ys = append(ys, y)
		}
	}
	for i := 2; i < len(ys); i++ {
		if d0, d1 := ys[i-1]-ys[i-2], ys[i]-ys[i-1]; d0-d1 > 0.2 || d1-d0 > 0.2 {
			t.Errorf("ticks at %v are not evenly spaced", ys)
			break
		}
	}
	for _, label := range []string{"wait (log scale)", "percentile of grants", "grants", "worker"} {
		if !slices.ContainsFunc(els, func(e svgElement) bool { return strings.HasPrefix(e.text, label) }) {
			t.Errorf("no axis label %q", label)
		}
	}
}

func TestWriteChartsWritesOneFilePerWorkload(t *testing.T) {
	results := chartResults()
	other := results[0]
	other.Workload = "uncontended"
	rep := &Report{Results: append(results, other)}
	dir := t.TempDir()
	paths, err := rep.WriteCharts(dir, "redis-")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{filepath.Join(dir, "redis-hot-8w-cs100us.svg"), filepath.Join(dir, "redis-uncontended.svg")}
	if !slices.Equal(paths, want) {
		t.Fatalf("wrote %q, want %q", paths, want)
	}
	data, err := os.ReadFile(paths[1])
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range parseSVG(t, string(data)) {
		if e.attrs["class"] == "series" {
			n++
		}
	}
	if n != 1 {
		t.Errorf("uncontended chart has %d series, want 1", n)
	}
}

func TestCurveReachesTheLongestWait(t *testing.T) {
	waits := make([]time.Duration, 1000)
	for i := range waits {
		waits[i] = time.Duration(i+1) * time.Millisecond
	}
	c := curve(waits)
	// k = 0..24 (10^(24/8) = 1000 grants), then the longest.
	if len(c) != 26 {
		t.Fatalf("%d points, want 26: %v", len(c), c)
	}
	if c[0].Q != 0 || c[0].Wait != time.Millisecond {
		t.Errorf("first point %+v, want q 0 at the shortest wait", c[0])
	}
	if c[16].Wait != 990*time.Millisecond { // q 0.99
		t.Errorf("q %.4f at %v, want 990ms", c[16].Q, c[16].Wait)
	}
	if last := c[len(c)-1]; last.Q != 1 || last.Wait != time.Second {
		t.Errorf("last point %+v, want q 1 at the longest wait", last)
	}
}
