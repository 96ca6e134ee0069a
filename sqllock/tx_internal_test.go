package sqllock

import (
	"slices"
	"strings"
	"testing"
)

// TestPartialStateReadsScanIntoTheirFields checks that each partial read of
// nameState (fairStateCols, sharedReqCols, releaseStateCols) scans every
// subquery into the field that stateCols scans it into: nameState.dest,
// fairDest, sharedDest and releaseDest list pointers by hand, and a
// mismatch between two fields of one type (two counts, two expiries) would
// scan without an error, into the wrong field.
func TestPartialStateReadsScanIntoTheirFields(t *testing.T) {
	// stateCols' subqueries, in its order.
	pieces := []string{sLive, sExpired, sMine, sFirstOwner, sFirstLeft, sLastOwner, sLastLeft, sMaxOthers,
		qMySeq, qMyLeft, qLive, qAhead, qHead, qMaxSeq, qExpired, gMine}
	if strings.Join(pieces, ",") != stateCols {
		t.Fatal("stateCols is not the subqueries this test lists, in this order")
	}
	var st nameState
	full := st.dest()
	if len(full) != len(pieces) {
		t.Fatalf("nameState.dest lists %d fields, stateCols reads %d", len(full), len(pieces))
	}
	field := make(map[string]any, len(pieces))
	for i, p := range pieces {
		if _, dup := field[p]; dup {
			t.Fatalf("subquery %d of stateCols repeats an earlier one", i)
		}
		field[p] = full[i]
	}

	// split cuts cols into the subqueries of pieces, the longest first.
	split := func(cols string) ([]string, bool) {
		var out []string
		for {
			best := ""
			for _, p := range pieces {
				if strings.HasPrefix(cols, p) && len(p) > len(best) {
					best = p
				}
			}
			if best == "" {
				return out, false
			}
			out = append(out, best)
			cols = cols[len(best):]
			if cols == "" {
				return out, true
			}
			if cols[0] != ',' {
				return out, false
			}
			cols = cols[1:]
		}
	}
	for _, tc := range []struct {
		name string
		cols string
		dest []any
	}{
		{"fairStateCols", fairStateCols, st.fairDest()},
		{"sharedReqCols", sharedReqCols, st.sharedDest()},
		{"releaseStateCols", releaseStateCols, st.releaseDest()},
	} {
		got, ok := split(tc.cols)
		if !ok {
			t.Errorf("%s: not made of stateCols' subqueries after the %d-th", tc.name, len(got))
			continue
		}
		if len(got) != len(tc.dest) {
			t.Errorf("%s reads %d columns, its dest lists %d", tc.name, len(got), len(tc.dest))
			continue
		}
		for i, p := range got {
			if tc.dest[i] != field[p] {
				t.Errorf("%s: column %d scans into another field than stateCols' column %d", tc.name, i, slices.Index(pieces, p))
			}
		}
	}
}
