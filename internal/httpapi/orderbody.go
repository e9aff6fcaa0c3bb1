package httpapi

import (
	"unicode/utf8"
)

// decodeOrderBody decodes an order's body in the shape clients send it —
// an object of sku, quantity and user_id, each at most once, the strings
// without escapes, the quantity a plain integer — without encoding/json,
// which spent about a seventh of the service's CPU on a sold-out answer
// (its decoder works token by token through reflection). It reports false
// for anything else, and then readJSON's way decodes the body and words
// what is wrong with it: where this succeeds, that way gives the same
// value (FuzzDecodeOrderBody), so no answer of the API depends on it.
func decodeOrderBody(body []byte, v *orderRequest) bool {
	p := orderBodyParser{b: body}
	if !p.byte('{') {
		return false
	}
	var seen [3]bool
	if !p.byte('}') {
		for {
			key, ok := p.plainString()
			if !ok || !p.byte(':') {
				return false
			}
			switch key {
			case "sku", "user_id":
				s, ok := p.plainString()
				if !ok {
					return false
				}
				i, field := 0, &v.SKU
				if key == "user_id" {
					i, field = 2, &v.UserID
				}
				if seen[i] {
					return false
				}
				seen[i] = true
				*field = &s
			case "quantity":
				n, ok := p.integer()
				if !ok || seen[1] {
					return false
				}
				seen[1] = true
				v.Quantity = n
			default:
				return false
			}
			if p.byte('}') {
				break
			}
			if !p.byte(',') {
				return false
			}
		}
	}
	p.space()
	return p.i == len(p.b)
}

// orderBodyParser reads JSON's plainest forms from b, from i on, each
// after any whitespace.
type orderBodyParser struct {
	b []byte
	i int
}

func (p *orderBodyParser) space() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

// byte consumes c if it comes next.
func (p *orderBodyParser) byte(c byte) bool {
	p.space()
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

// plainString reads a string with no escape, no control character and
// valid UTF-8 (encoding/json would replace invalid bytes): its bytes are
// its value.
func (p *orderBodyParser) plainString() (string, bool) {
	if !p.byte('"') {
		return "", false
	}
	start := p.i
	for p.i < len(p.b) {
		switch c := p.b[p.i]; {
		case c == '"':
			s := p.b[start:p.i]
			p.i++
			return string(s), utf8.Valid(s)
		case c == '\\' || c < 0x20:
			return "", false
		}
		p.i++
	}
	return "", false
}

// integer reads a JSON number that is an integer as written: an optional
// minus and digits, no leading zero (JSON refuses one), no fraction or
// exponent. It returns the number's text, as encoding/json would keep it
// in a json.RawMessage.
func (p *orderBodyParser) integer() ([]byte, bool) {
	p.space()
	start := p.i
	if p.i < len(p.b) && p.b[p.i] == '-' {
		p.i++
	}
	digits := p.i
	for p.i < len(p.b) && '0' <= p.b[p.i] && p.b[p.i] <= '9' {
		p.i++
	}
	switch {
	case p.i == digits, p.b[digits] == '0' && p.i-digits > 1:
		return nil, false
	case p.i < len(p.b) && (p.b[p.i] == '.' || p.b[p.i] == 'e' || p.b[p.i] == 'E'):
		return nil, false
	}
	return p.b[start:p.i], true
}
