package httpapi

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"
)

// errorBody is the API's error shape as encoding/json would write it.
type errorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// TestRenderedAsEncodingJSON: the hand-written answers are encoding/json's
// bytes, with and without expires_at, for plain and escaped strings.
func TestRenderedAsEncodingJSON(t *testing.T) {
	expires := time.Date(2026, 11, 28, 17, 4, 5, 123456789, time.FixedZone("x", 3600))
	far := time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC) // encoding/json refuses it
	for _, r := range []orderResponse{
		{OrderID: "0193-ab", SKU: "s-1", Quantity: 1, UserID: "u", Strategy: "batched", State: "final"},
		{OrderID: "id", SKU: `a"b\c<d>&é` + "\x01\u2028\xff", Quantity: -9, UserID: "", Strategy: "s", State: "held", ExpiresAt: &expires},
	} {
		want, _ := json.Marshal(r)
		if got, err := appendOrderJSON(nil, r); err != nil || !bytes.Equal(got, want) {
			t.Errorf("order %+v:\n got %s %v\nwant %s", r, got, err, want)
		}
	}
	// encoding/json refuses a year past 9999; so does the hand-written
	// way, and writeOrder then answers as gin's c.JSON does.
	if _, err := appendOrderJSON(nil, orderResponse{OrderID: "id", State: "held", ExpiresAt: &far}); err == nil {
		t.Error("an expiry past 9999 was written")
	}
	for _, m := range [][2]string{{"sold_out", `sold out: fewer than 1 units of "s-1" are available`}, {"x", "<&>\t\u00e9"}} {
		var e errorBody
		e.Error.Code, e.Error.Message = m[0], m[1]
		want, _ := json.Marshal(e)
		if got := appendErrorJSON(nil, m[0], m[1]); !bytes.Equal(got, want) {
			t.Errorf("error %q:\n got %s\nwant %s", m, got, want)
		}
	}
}

func FuzzAppendJSONString(f *testing.F) {
	for _, s := range []string{"", "s-1", `"`, `\`, "<>&", "\x00", "é", "\xff", "\u2028", "a\u007fb"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, _ := json.Marshal(s)
		if got := appendJSONString([]byte("x"), s); !bytes.Equal(got[1:], want) || got[0] != 'x' {
			t.Fatalf("%q: got %s, want x%s", s, got, want)
		}
	})
}
