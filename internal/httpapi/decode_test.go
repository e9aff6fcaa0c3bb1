package httpapi

import (
	"reflect"
	"strings"
	"testing"
)

// The one-pass decoder is a shortcut: wherever it succeeds, the careful
// decoder must succeed with the same value, and wherever the careful one
// decodes an object, the shortcut must too (or it is not taken where it
// pays; a bare null, which the careful way lets through to the missing
// fields' message, need not). Where it fails, readJSON's answer is the careful decoder's, so the
// API's error messages do not depend on it.
func FuzzDecodeInOnePass(f *testing.F) {
	for _, seed := range []string{
		`{"sku":"s-1","quantity":1,"user_id":"u"}`,
		` { "user_id" : "u" , "sku" : "s" , "quantity" : 2 } `,
		`{"sku":"s-1","quantity":1,"user_id":"u"} x`,
		`{"sku":"s-1","quantity":1,"user_id":"u"}{}`,
		`{"sku":"s-1","quantity":"1","user_id":"u"}`,
		`{"sku":1,"quantity":1,"user_id":"u"}`,
		`{"sku":null,"quantity":null,"user_id":null}`,
		`{"sku":"s","sku":"t"}`,
		`{"SKU":"s"}`, `{"ſku":"s"}`, `{"x":1}`, `{"quantity":[1,2]}`, `{"quantity":{"a":1}}`,
		`{"sku":"\ud800","quantity":1e309,"user_id":"a\u0000b"}`,
		`{}`, `[]`, `"x"`, `{`, ``, `{"sku":}`, `{"sku":"s",}`, `{,}`, "\x00",
		`{"sku":"` + strings.Repeat("é", 70) + `"}`,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, body string) {
		var fast, careful orderRequest
		ok := decodeInOnePass([]byte(body), &fast)
		err := decodeCarefully([]byte(body), &careful)
		switch {
		case ok && err != nil:
			t.Fatalf("%q: one pass decoded it, the careful way refused it: %v", body, err)
		case !ok && err == nil && strings.HasPrefix(strings.TrimLeft(body, " \t\r\n"), "{"):
			t.Fatalf("%q: the careful way decoded it, one pass did not", body)
		case ok && !reflect.DeepEqual(fast, careful):
			t.Fatalf("%q: one pass gave %+v, the careful way %+v", body, fast, careful)
		}
	})
}

// The order body's shortcut: wherever it succeeds, the careful decoder
// must succeed with the same value. It may refuse anything out of the
// ordinary (the careful way then decides), but not the bodies clients
// send, or it is not taken where it pays.
func FuzzDecodeOrderBody(f *testing.F) {
	sent := []string{
		`{"sku":"s-1","quantity":1,"user_id":"u"}`,
		` { "user_id" : "u" , "sku" : "s" , "quantity" : 2 } ` + "\n",
		`{"sku":"` + strings.Repeat("é", 20) + `","quantity":-3,"user_id":"ü"}`,
		`{"quantity":0}`, `{}`,
	}
	for _, body := range sent {
		var v orderRequest
		if !decodeOrderBody([]byte(body), &v) {
			f.Fatalf("%q: the shortcut refused a body as clients send it", body)
		}
	}
	for _, seed := range append(sent,
		`{"sku":"s-1","quantity":1,"user_id":"u"} x`,
		`{"sku":"s-1","quantity":1,"user_id":"u"}{}`,
		`{"sku":"s-1","quantity":"1","user_id":"u"}`,
		`{"sku":1,"quantity":1,"user_id":"u"}`,
		`{"sku":null,"quantity":null,"user_id":null}`,
		`{"sku":"s","sku":"t"}`, `{"quantity":1,"quantity":1}`,
		`{"SKU":"s"}`, `{"ſku":"s"}`, `{"x":1}`, `{"quantity":[1,2]}`,
		`{"quantity":01}`, `{"quantity":-}`, `{"quantity":1.0}`, `{"quantity":1e2}`, `{"quantity":+1}`, `{"quantity":1x}`,
		`{"sku":"a\"b"}`, `{"sku":"a\u0041"}`, "{\"sku\":\"a\x01\"}", "{\"sku\":\"\xff\"}", `{"sku":"é`,
		`{"sku":"s",}`, `{,}`, `{`, ``, `{"sku":}`, `[]`, "\x00", `{"sku":"s"}}`,
	) {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, body string) {
		var fast, careful orderRequest
		if !decodeOrderBody([]byte(body), &fast) {
			return
		}
		if err := decodeCarefully([]byte(body), &careful); err != nil {
			t.Fatalf("%q: the shortcut decoded it, the careful way refused it: %v", body, err)
		}
		if !reflect.DeepEqual(fast, careful) {
			t.Fatalf("%q: the shortcut gave %+v, the careful way %+v", body, fast, careful)
		}
	})
}
