package collectived_test

import (
	"errors"
	"strings"
	"testing"

	collectived "github.com/collectived/collectived/clients/go"
	"github.com/collectived/collectived/collective"
	"github.com/collectived/collectived/ipc"
)

// The version-3 calls the client refuses before sending, each with an
// error that names what is wrong; the connection goes on.
func TestVersion3CallErrors(t *testing.T) {
	c := dial(t)
	w := c.Size()
	cases := []struct {
		err  error
		is   error
		want string
	}{
		{collectived.AllGatherV(c, []int32{1}, make([]int, w+1), make([]int32, 1)), ipc.ErrBadRequest, "per-rank counts for a world of"},
		{collectived.AllGatherV(c, []int32{1}, append(make([]int, w-1), -1), make([]int32, 1)), nil, "is negative"},
		{collectived.AllGather(c, []int32{1, 2}, make([]int32, 2*w+1)), nil, "result buffer is"},
		{c.DoInto(collective.Desc{Op: collective.OpAllReduce, DType: collective.Int32, Reduce: collective.Sum, Count: 1}, make([]byte, 4), make([]byte, 4)), nil, "works in place; use Start"},
		{c.Do(collective.Desc{Op: collective.OpAllGather, DType: collective.Int32, Count: 1}, make([]byte, 4)), nil, "use StartInto"},
	}
	for i, tc := range cases {
		if tc.err == nil || !strings.Contains(tc.err.Error(), tc.want) || tc.is != nil && !errors.Is(tc.err, tc.is) {
			t.Errorf("case %d: %v, want an error saying %q", i, tc.err, tc.want)
		}
	}
	x := []int32{3}
	if err := collectived.AllReduce(c, x, collectived.Sum); err != nil {
		t.Fatalf("the call after the refusals: %v", err)
	}
}

// Against a version-2 daemon every version-3 call fails before it is
// sent, naming the version; a version-2 call still goes.
func TestVersion3CallsNeedVersion3(t *testing.T) {
	path, _ := oldDaemon(t, 2, nil, 0, nil)
	c, err := collectived.Dial(collectived.Options{Socket: path, Job: "x", LocalRank: -1, NoLane: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, err := range []error{
		collectived.AllGather(c, []int32{1}, make([]int32, c.Size())),
		collectived.AllReduce(c, []collectived.BFloat16{1}, collectived.Sum),
		collectived.AllReduce(c, []float32{1}, collectived.Avg),
		collectived.Reduce(c, []float32{1}, 0, collectived.Sum),
	} {
		if !errors.Is(err, ipc.ErrUnsupported) || !strings.Contains(err.Error(), "needs protocol version 3") || !strings.Contains(err.Error(), "speaks 2") {
			t.Errorf("%v, want UNSUPPORTED naming versions 3 and 2", err)
		}
	}
}
