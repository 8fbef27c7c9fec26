package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"

	"go.yaml.in/yaml/v3"
)

// MaxFileBytes bounds the config file Load reads.
const MaxFileBytes = 1 << 20

// Load reads the config file at path and parses it (see Parse).
func Load(path string) (*Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("config: read %s: %w", path, err)
	}
	if len(data) > MaxFileBytes {
		return nil, ErrorList{{Source: path, Err: fmt.Errorf("file is larger than %d bytes; is this the config?", MaxFileBytes)}}
	}
	return Parse(data, path)
}

// Parse reads one YAML document, fills a Config starting from Default(),
// and validates it. source names the data in errors (usually the file
// path).
//
// The document is decoded into a yaml.Node tree and walked by hand rather
// than unmarshaled into structs: strict unknown-key checking
// (Decoder.KnownFields) is lost inside custom unmarshalers, and the tree
// keeps the line of every key, so every error, from a misspelled key to a
// rank out of range, names its key and line.
//
// On failure Parse returns nil and an ErrorList of every problem found.
// Values that did not parse are not validated again.
func Parse(data []byte, source string) (*Config, error) {
	p := &parser{o: &origin{source: source, lines: map[string]int{}, bad: map[string]bool{}}}
	c := Default()
	c.pos = p.o
	if root := p.document(data); root != nil {
		p.o.lines[""] = root.Line
		p.mapping(root, "", rootFields(&c))
		// A value that did not parse was reported once already; checks on
		// it or on its section would only repeat the same mistake.
		for _, e := range c.validate() {
			if !p.o.isBad(e.Key) {
				p.errs = append(p.errs, e)
			}
		}
	}
	if err := p.errs.err(); err != nil {
		return nil, err
	}
	return &c, nil
}

type parser struct {
	o    *origin
	errs ErrorList
}

func (p *parser) fail(line int, key string, err error) {
	p.errs = append(p.errs, &Error{Source: p.o.source, Line: line, Key: key, Err: err})
	if key != "" {
		p.o.bad[key] = true
	}
}

func (p *parser) failf(line int, key, format string, args ...any) {
	p.fail(line, key, fmt.Errorf(format, args...))
}

var yamlLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// yamlError places a syntax error from the YAML decoder at its line.
func (p *parser) yamlError(err error) {
	msg := err.Error()
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		p.fail(line, "", errors.New("YAML syntax: "+m[2]))
		return
	}
	p.fail(0, "", fmt.Errorf("YAML syntax: %w", err))
}

// document decodes exactly one YAML document and returns its top-level
// mapping, or nil after recording why there is none.
func (p *parser) document(data []byte) *yaml.Node {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			p.fail(1, "", errors.New("config is empty: it needs at least job: and peers:"))
		} else {
			p.yamlError(err)
		}
		return nil
	}
	var extra yaml.Node
	switch err := dec.Decode(&extra); {
	case err == nil:
		p.fail(max(extra.Line, 1), "", errors.New("a second YAML document starts here; a config is exactly one document"))
		return nil
	case !errors.Is(err, io.EOF):
		p.yamlError(err)
		return nil
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 {
		p.fail(max(doc.Line, 1), "", errors.New("config is not a single YAML document"))
		return nil
	}
	root := deref(doc.Content[0])
	if isNull(root) {
		p.fail(max(root.Line, 1), "", errors.New("config is empty: it needs at least job: and peers:"))
		return nil
	}
	if root.Kind != yaml.MappingNode {
		p.failf(root.Line, "", "the top level must be a mapping of keys (job:, peers:, ...), not %s", describe(root))
		return nil
	}
	return root
}

// deref follows an alias to its anchored node.
func deref(n *yaml.Node) *yaml.Node {
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		return n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// describe names what a node is, for "must be X, not Y" messages.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	case yaml.DocumentNode:
		return "a document"
	}
	switch n.ShortTag() {
	case "!!str":
		return fmt.Sprintf("the string %q", n.Value)
	case "!!int":
		return "the integer " + n.Value
	case "!!float":
		return "the number " + n.Value
	case "!!bool":
		return "the boolean " + n.Value
	case "!!null":
		return "nothing"
	}
	return fmt.Sprintf("%q tagged %s", n.Value, n.Tag)
}
