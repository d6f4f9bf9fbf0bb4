package logging

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// DuplicateKeys returns the keys that appear more than once in one object of a JSON log
// line (nested objects are checked on their own), so tests can hold every component's
// lines to the rule of this package: a key once per line. encoding/json would keep the
// last of two silently.
func DuplicateKeys(line []byte) ([]string, error) {
	dec := json.NewDecoder(bytes.NewReader(line))
	var dups []string
	if err := walkValue(dec, &dups); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("trailing data after the JSON value")
	}
	return dups, nil
}

func walkValue(dec *json.Decoder, dups *[]string) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch tok {
	case json.Delim('{'):
		seen := map[string]bool{}
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				return err
			}
			key, _ := k.(string)
			if seen[key] {
				*dups = append(*dups, key)
			}
			seen[key] = true
			if err := walkValue(dec, dups); err != nil {
				return err
			}
		}
		_, err = dec.Token() // '}'
		return err
	case json.Delim('['):
		for dec.More() {
			if err := walkValue(dec, dups); err != nil {
				return err
			}
		}
		_, err = dec.Token() // ']'
		return err
	}
	return nil
}
