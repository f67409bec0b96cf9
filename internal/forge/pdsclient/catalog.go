package pdsclient

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"sort"

	"github.com/bluesky-social/indigo/atproto/atdata"
	"github.com/bluesky-social/indigo/atproto/lexicon"

	lexicons "knotless.dev/run/lexicons/dev/knotless"
)

// Catalog is the set of knotless lexicons.
type Catalog struct {
	cat *lexicon.BaseCatalog
	// objects maps an object def ("dev.knotless.putRunOutput#input") to
	// the record type wrapping it, which is how ValidateObject validates
	// an XRPC body with indigo's record validator.
	objects map[string]string
}

// NewCatalog loads the embedded knotless lexicons.
func NewCatalog() (*Catalog, error) {
	cat := lexicon.NewBaseCatalog()
	if err := cat.LoadEmbedFS(lexicons.Files); err != nil {
		return nil, fmt.Errorf("load knotless lexicons: %w", err)
	}
	objects, err := wrapObjects(cat)
	if err != nil {
		return nil, fmt.Errorf("load knotless lexicons: %w", err)
	}
	return &Catalog{cat: cat, objects: objects}, nil
}

// wrapObjects adds, for each object def of the embedded lexicons, a
// record type whose one property v is a ref to it, and returns the map
// from def to that record type.
func wrapObjects(cat *lexicon.BaseCatalog) (map[string]string, error) {
	entries, err := fs.ReadDir(lexicons.Files, ".")
	if err != nil {
		return nil, err
	}
	objects := map[string]string{}
	for _, e := range entries {
		b, err := lexicons.Files.ReadFile(e.Name())
		if err != nil {
			return nil, err
		}
		var f struct {
			ID   string `json:"id"`
			Defs map[string]struct {
				Type string `json:"type"`
			} `json:"defs"`
		}
		if err := json.Unmarshal(b, &f); err != nil {
			return nil, fmt.Errorf("%s: %w", e.Name(), err)
		}
		names := make([]string, 0, len(f.Defs))
		for name, d := range f.Defs {
			if d.Type == "object" {
				names = append(names, name)
			}
		}
		sort.Strings(names)
		for _, name := range names {
			ref := f.ID + "#" + name
			id := fmt.Sprintf("dev.knotless.validate.object%d", len(objects))
			wrapper := fmt.Sprintf(`{"lexicon":1,"id":%q,"defs":{"main":{"type":"record","key":"any","record":{"type":"object","required":["v"],"properties":{"v":{"type":"ref","ref":%q}}}}}}`, id, ref)
			var sf lexicon.SchemaFile
			if err := json.Unmarshal([]byte(wrapper), &sf); err != nil {
				return nil, err
			}
			if err := cat.AddSchemaFile(sf); err != nil {
				return nil, fmt.Errorf("wrap %s: %w", ref, err)
			}
			objects[ref] = id
		}
	}
	return objects, nil
}

// ValidateObject checks the JSON of an object of the knotless lexicons
// that is not a record (an XRPC method's input or output, as
// "dev.knotless.putRunOutput#input") against its lexicon.
func (c *Catalog) ValidateObject(ref string, raw []byte) error {
	id, ok := c.objects[ref]
	if !ok {
		return fmt.Errorf("validate %s: no such object in the knotless lexicons", ref)
	}
	data, err := atdata.UnmarshalJSON(raw)
	if err != nil {
		return lexiconError{fmt.Errorf("%s: %w", ref, err)}
	}
	wrapped := map[string]any{"$type": id, "v": data}
	if err := lexicon.ValidateRecord(c.cat, wrapped, id, lexicon.AllowLenientDatetime); err != nil {
		return lexiconError{fmt.Errorf("%s: %w", ref, err)}
	}
	return nil
}

// Validate checks the JSON of a record against the lexicon of
// collection.
func (c *Catalog) Validate(collection string, raw []byte) error {
	data, err := atdata.UnmarshalJSON(raw)
	if err != nil {
		return lexiconError{fmt.Errorf("%s record: %w", collection, err)}
	}
	if err := lexicon.ValidateRecord(c.cat, data, collection, lexicon.AllowLenientDatetime); err != nil {
		return lexiconError{fmt.Errorf("%s record: %w", collection, err)}
	}
	return nil
}

// ErrInvalid is a record that does not match its lexicon (Validate,
// also before a write): sending it again cannot help.
var ErrInvalid = errors.New("record does not match its lexicon")

// lexiconError is a Validate error: its text, and errors.Is ErrInvalid.
type lexiconError struct{ error }

func (e lexiconError) Is(target error) bool { return target == ErrInvalid }
func (e lexiconError) Unwrap() error        { return e.error }

// Decode validates raw as a record of collection and decodes it into v.
func (c *Catalog) Decode(collection string, raw []byte, v any) error {
	if err := c.Validate(collection, raw); err != nil {
		return err
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return fmt.Errorf("%s record: %w", collection, err)
	}
	return nil
}

// Encode marshals v, validates it as a record of
// collection and returns it as a plain JSON object for the write calls.
func (c *Catalog) Encode(collection string, v any) (map[string]any, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode %s record: %w", collection, err)
	}
	if err := c.Validate(collection, raw); err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("encode %s record: %w", collection, err)
	}
	return m, nil
}
