package httpapi

import (
	"encoding/json"
	"strconv"

	"github.com/gin-gonic/gin"
)

// The answers given most under a flash sale — a 201's order and a 409's
// error — are written by hand, byte for byte what encoding/json writes
// (TestRenderedAsEncodingJSON, FuzzAppendJSONString): its reflection was
// a twentieth of the service's CPU on a sale. Everything else goes
// through gin's c.JSON.

// jsonContentType is gin's for c.JSON.
const jsonContentType = "application/json; charset=utf-8"

// writeOrder answers status with the order.
func writeOrder(c *gin.Context, status int, r orderResponse) {
	b, err := appendOrderJSON(make([]byte, 0, 256), r)
	if err != nil {
		// An expiry past the year 9999: gin's way, which records the
		// error, as before.
		c.JSON(status, r)
		return
	}
	c.Data(status, jsonContentType, b)
}

func appendOrderJSON(b []byte, r orderResponse) ([]byte, error) {
	b = append(b, `{"order_id":`...)
	b = appendJSONString(b, r.OrderID)
	b = append(b, `,"sku":`...)
	b = appendJSONString(b, r.SKU)
	b = append(b, `,"quantity":`...)
	b = strconv.AppendInt(b, r.Quantity, 10)
	b = append(b, `,"user_id":`...)
	b = appendJSONString(b, r.UserID)
	b = append(b, `,"strategy":`...)
	b = appendJSONString(b, r.Strategy)
	b = append(b, `,"state":`...)
	b = appendJSONString(b, r.State)
	if r.ExpiresAt != nil {
		t, err := r.ExpiresAt.MarshalJSON()
		if err != nil {
			return nil, err // encoding/json fails on it too
		}
		b = append(b, `,"expires_at":`...)
		b = append(b, t...)
	}
	return append(b, '}'), nil
}

func appendErrorJSON(b []byte, code, message string) []byte {
	b = append(b, `{"error":{"code":`...)
	b = appendJSONString(b, code)
	b = append(b, `,"message":`...)
	b = appendJSONString(b, message)
	return append(b, "}}"...)
}

// appendJSONString appends s as encoding/json writes a string: printable
// ASCII but the quote, the backslash and the HTML characters it escapes
// as written, anything else through encoding/json.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			quoted, _ := json.Marshal(s) // a string always marshals
			return append(b, quoted...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
