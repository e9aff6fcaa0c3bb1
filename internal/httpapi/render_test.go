package httpapi

import (
	"bytes"
	"encoding/json"
	"slices"
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

// escapedByEncodingJSON is every character encoding/json does not write
// as itself: each byte below 0x20, the quote, the backslash, the HTML
// characters <, > and &, U+2028 and U+2029, and each byte that is not
// valid UTF-8 (0x80 to 0xff alone, and a truncated sequence), which it
// writes as U+FFFD.
func escapedByEncodingJSON() []string {
	var cs []string
	for c := range 0x20 {
		cs = append(cs, string(rune(c)))
	}
	cs = append(cs, `"`, `\`, "<", ">", "&", "\u2028", "\u2029", "\xe2\x80")
	for c := 0x80; c <= 0xff; c++ {
		cs = append(cs, string([]byte{byte(c)}))
	}
	return cs
}

// inContext is c alone and between plain characters: at the start, in the
// middle and at the end of a string, so that no character is escaped only
// because another one in its string sent it down encoding/json's path.
func inContext(c string) []string {
	return []string{c, "a" + c + "b", "ab" + c, c + "ab"}
}

// TestAppendJSONStringEscapesEachCharacterAsEncodingJSON: each character
// encoding/json escapes, alone and between plain characters, and each
// character it writes as itself, come out byte for byte as json.Marshal
// writes them.
func TestAppendJSONStringEscapesEachCharacterAsEncodingJSON(t *testing.T) {
	escaped := escapedByEncodingJSON()
	for _, c := range escaped {
		// The list is what it says: encoding/json does escape c.
		if quoted, _ := json.Marshal(c); string(quoted) == `"`+c+`"` {
			t.Errorf("encoding/json writes %q as itself; it does not belong in escapedByEncodingJSON", c)
		}
	}
	// The rest: the other printable ASCII characters, DEL, and valid
	// UTF-8 beyond ASCII.
	plain := []string{"\x7f", "é", "\u2027", "\u202a", "\U0001F600"}
	for c := byte(0x20); c < 0x7f; c++ {
		if !slices.Contains(escaped, string(c)) {
			plain = append(plain, string(c))
		}
	}
	for _, c := range append(escaped, plain...) {
		for _, s := range inContext(c) {
			want, _ := json.Marshal(s)
			if got := appendJSONString(nil, s); !bytes.Equal(got, want) {
				t.Errorf("%q: got %s, want %s", s, got, want)
			}
		}
	}
}

// FuzzAppendJSONString: any string, appended to bytes already written,
// comes out as json.Marshal writes it, and leaves those bytes alone. The
// seeds hold each kind of character encoding/json escapes, alone and
// between plain characters. Every one of them is
// TestAppendJSONStringEscapesEachCharacterAsEncodingJSON's: each seed
// costs the fuzzer about 30 ms of baseline coverage here.
func FuzzAppendJSONString(f *testing.F) {
	for _, s := range []string{"", "s-1", "a\u007fb", "é"} {
		f.Add(s)
	}
	for _, c := range []string{"\x00", "\n", "\x1f", `"`, `\`, "<", ">", "&", "\u2028", "\u2029", "\x80", "\xff", "\xe2\x80"} {
		for _, s := range inContext(c) {
			f.Add(s)
		}
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, _ := json.Marshal(s)
		if got := appendJSONString([]byte("x"), s); !bytes.Equal(got[1:], want) || got[0] != 'x' {
			t.Fatalf("%q: got %s, want x%s", s, got, want)
		}
	})
}
