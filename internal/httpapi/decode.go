package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/gin-gonic/gin"
)

// readJSON reads a JSON object body of at most MaxBodyBytes into v (a
// pointer to a struct), refusing unknown fields, field names that match only
// case-insensitively, repeated fields, and anything after the object. Every
// JSON body goes through it, but an order's in its plainest shape
// (decodeOrderBody).
func readJSON(c *gin.Context, v any) error {
	body, err := readBody(c)
	if err != nil {
		return err
	}
	return decodeJSON(body, v)
}

// readBody reads a JSON body of at most MaxBodyBytes.
func readBody(c *gin.Context) ([]byte, error) {
	return readBodyUpTo(c, MaxBodyBytes)
}

// readBodyUpTo reads a JSON body of at most limit bytes.
func readBodyUpTo(c *gin.Context, limit int64) ([]byte, error) {
	// The header as clients send it needs no parsing (ParseMediaType
	// allocates a map for the parameters on every order).
	if ct := c.GetHeader("Content-Type"); ct != "application/json" {
		mediaType, _, err := mime.ParseMediaType(ct)
		if err != nil || mediaType != "application/json" {
			return nil, errUnsupportedMediaType
		}
	}
	body, err := io.ReadAll(http.MaxBytesReader(c.Writer, c.Request.Body, limit))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return nil, invalid("body is larger than %d bytes", limit)
		}
		return nil, invalid("reading body: %v", err)
	}
	return body, nil
}

// decodeJSON decodes body into v as readJSON says.
func decodeJSON(body []byte, v any) error {
	if decodeInOnePass(body, v) {
		return nil
	}
	// Something is off: start again on a zero value and take the careful
	// way, whose answers say what.
	reflect.ValueOf(v).Elem().SetZero()
	return decodeCarefully(body, v)
}

// decodeCarefully decodes body into v, or says in words what is wrong with
// it.
func decodeCarefully(body []byte, v any) error {
	if err := checkKeys(body, jsonFields(v)); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return invalid("malformed JSON: %v", describeJSONError(err))
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return invalid("malformed JSON: unexpected data after the object")
	}
	return nil
}

// decodeInOnePass decodes a well-formed body into v in one walk and
// reports whether it could: a JSON object whose every key names a field of
// v exactly and once, every value of the field's type, nothing after it.
// It reads each order's body once instead of twice (checkKeys, then the
// decoder), which was a sixth of the service's CPU under a burst. When it
// reports false, v may be half-filled and nothing is said about why:
// readJSON then takes the careful way, which finds and words the problem.
func decodeInOnePass(body []byte, v any) bool {
	index := fieldIndexOf(reflect.TypeOf(v).Elem())
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return false
	}
	target := reflect.ValueOf(v).Elem()
	seen := make([]bool, target.NumField())
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		i, ok := index[tok.(string)]
		if !ok || seen[i] {
			return false
		}
		seen[i] = true
		if err := dec.Decode(target.Field(i).Addr().Interface()); err != nil {
			return false
		}
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim('}') {
		return false
	}
	_, err := dec.Token()
	return errors.Is(err, io.EOF)
}

var fieldIndexCache sync.Map // reflect.Type -> map[string]int

// fieldIndexOf maps the JSON names of struct type t's exported fields to
// their indexes, once per type.
func fieldIndexOf(t reflect.Type) map[string]int {
	if f, ok := fieldIndexCache.Load(t); ok {
		return f.(map[string]int)
	}
	index := make(map[string]int, t.NumField())
	for i := range t.NumField() {
		if name, ok := jsonName(t.Field(i)); ok && t.Field(i).IsExported() {
			index[name] = i
		}
	}
	fieldIndexCache.Store(t, index)
	return index
}

// checkKeys refuses what encoding/json would let through: a key that
// matches a field only case-insensitively ("SKU", "User_Id", or "ſku" with
// a long s), and a key given twice (json keeps the last, so a proxy or a log
// reading the first would see another order). It walks the top-level object
// only; a body that is not an object or not JSON is left for the decoder to
// describe.
func checkKeys(body []byte, fields []string) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil
	}
	seen := make(map[string]bool, len(fields))
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil
		}
		key, ok := tok.(string)
		if !ok {
			return nil
		}
		if seen[key] {
			return invalid("field %q appears more than once", truncate(key, 32))
		}
		seen[key] = true
		if !slices.Contains(fields, key) {
			return invalid("unknown field %q (names are case-sensitive: %s)", truncate(key, 32), strings.Join(fields, ", "))
		}
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			return nil
		}
	}
	return nil
}

// jsonFields lists the JSON names of the fields of the struct v points to.
func jsonFields(v any) []string {
	t := reflect.TypeOf(v).Elem()
	names := make([]string, 0, t.NumField())
	for i := range t.NumField() {
		if name, ok := jsonName(t.Field(i)); ok {
			names = append(names, name)
		}
	}
	return names
}

// jsonName is f's name in JSON, and false for a field encoding/json skips
// by its tag ("-").
func jsonName(f reflect.StructField) (string, bool) {
	name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
	if name == "" {
		name = f.Name
	}
	return name, name != "-"
}

func describeJSONError(err error) string {
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		if typeErr.Field == "" {
			return "body must be a JSON object"
		}
		return fmt.Sprintf("field %q must not be a %s", typeErr.Field, typeErr.Value)
	}
	if errors.Is(err, io.EOF) {
		return "body is empty"
	}
	return err.Error()
}

// integer parses a JSON number that is an integer written as such: no
// fraction, no exponent, not a string.
func integer(raw json.RawMessage, field string) (int64, error) {
	if len(raw) == 0 {
		return 0, invalid("%s is required", field)
	}
	n, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil {
		return 0, invalid("%s must be an integer, not %s", field, truncate(string(raw), 32))
	}
	return n, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
