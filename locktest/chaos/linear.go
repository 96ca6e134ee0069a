package chaos

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// operation is one lease's critical section on one name, as the resource
// saw it: the value its first read returned and, if a write of it was
// accepted, the value written. Call is the read's start, ret the write's end
// (or the read's when nothing was written).
type operation struct {
	client  string
	lease   string
	read    Value
	wrote   bool
	written Value
	call    int64
	ret     int64
}

type linearResult int

const (
	resultOK linearResult = iota
	resultIllegal
	resultUnknown
)

// registerModel is the sequential specification of a critical section on a
// register: it reads the current value and may replace it. A history of
// critical sections is linearizable under it exactly when they can be put in
// an order, consistent with real time, in which each read the value the one
// before left.
func registerModel(initial Value) porcupine.Model {
	init := encode(initial)
	return porcupine.Model{
		Init: func() any { return init },
		Step: func(state, input, output any) (bool, any) {
			in := input.(string)
			if state.(string) != in {
				return false, state
			}
			if out := output.(string); out != "" {
				return true, out
			}
			return true, state
		},
		DescribeOperation: func(input, output any) string {
			if out := output.(string); out != "" {
				return fmt.Sprintf("read %s, wrote %s", short(input.(string)), short(out))
			}
			return fmt.Sprintf("read %s", short(input.(string)))
		},
		DescribeState: func(state any) string { return short(state.(string)) },
	}
}

// encode turns a value into a comparable string: the stock, then the
// members.
func encode(v Value) string {
	var b strings.Builder
	b.WriteString(strconv.FormatInt(v.Stock, 10))
	for _, m := range v.Members {
		b.WriteByte(',')
		b.WriteString(strconv.FormatInt(m, 10))
	}
	return b.String()
}

// short describes an encoded value for the visualisation.
func short(enc string) string {
	stock, members, _ := strings.Cut(enc, ",")
	if members == "" {
		return "stock " + stock
	}
	return fmt.Sprintf("%d members", strings.Count(members, ",")+1)
}

func porcupineOps(ops []operation) []porcupine.Operation {
	clients := make(map[string]int)
	out := make([]porcupine.Operation, len(ops))
	for i, op := range ops {
		id, ok := clients[op.client]
		if !ok {
			id = len(clients)
			clients[op.client] = id
		}
		output := ""
		if op.wrote {
			output = encode(op.written)
		}
		out[i] = porcupine.Operation{ClientId: id, Input: encode(op.read), Output: output, Call: op.call, Return: op.ret,
			Metadata: op.client + " " + op.lease}
	}
	return out
}

func checkLinear(initial Value, ops []operation, timeout time.Duration) linearResult {
	switch porcupine.CheckOperationsTimeout(registerModel(initial), porcupineOps(ops), timeout) {
	case porcupine.Ok:
		return resultOK
	case porcupine.Illegal:
		return resultIllegal
	}
	return resultUnknown
}
