// Command go-oracle records what upstream ip-masq-agent's config pipeline says about each
// document gen.py writes: the accepted config, or the exact error text.
//
// The pipeline is upstream's syncConfig: apimachinery's yaml.ToJSON (input whose first
// non-space character is '{' is passed through as JSON, anything else goes through
// sigs.k8s.io/yaml's YAMLToJSON, i.e. go-yaml v2), encoding/json's Unmarshal over the
// defaults, then upstream's validate(). resyncInterval decodes like metav1.Duration.
//
// It reads gen.py's lines on stdin and writes the corpus on stdout, one JSON object a line:
//
//	{"id": ..., "doc": base64, "ipv6": bool, "reserved": bool,
//	 "yaml_json": text YAMLToJSON produced (absent for JSON input, when it failed, or when it
//	 differs from run to run),
//	 "ok": the accepted config (normalized, see accepted) | "err": the error text}
//
// Lines with a "routine" field instead ask one Go function about one input (routines.jsonl):
//
//	{"routine": name, "input": text (or "b64": bytes), "arg": base or bit size,
//	 "out": the result as text | "err": the error text}
//
// Build it in GOPATH mode against Debian's packages (see regenerate.sh).
package main

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode"

	"sigs.k8s.io/yaml"
)

// MasqConfig is upstream's config struct; its name shows in encoding/json's messages.
type MasqConfig struct {
	NonMasqueradeCIDRs []string `json:"nonMasqueradeCIDRs"`
	CidrLimit          int      `json:"cidrLimit"`
	MasqLinkLocal      bool     `json:"masqLinkLocal"`
	MasqLinkLocalIPv6  bool     `json:"masqLinkLocalIPv6"`
	ResyncInterval     Duration `json:"resyncInterval"`
}

// Duration decodes as metav1.Duration does: the JSON value into a string, then
// time.ParseDuration.
type Duration struct{ time.Duration }

// UnmarshalJSON follows metav1.Duration.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var str string
	if err := json.Unmarshal(b, &str); err != nil {
		return err
	}
	parsed, err := time.ParseDuration(str)
	if err != nil {
		return err
	}
	d.Duration = parsed
	return nil
}

// MarshalJSON follows metav1.Duration, so the log line upstream prints comes out as Go's.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.Duration.String()) }

func defaults(reserved bool) *MasqConfig {
	cidrs := []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"}
	if reserved {
		cidrs = append(cidrs, "100.64.0.0/10", "192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24",
			"198.18.0.0/15", "198.51.100.0/24", "203.0.113.0/24", "240.0.0.0/4")
	}
	return &MasqConfig{
		NonMasqueradeCIDRs: cidrs,
		CidrLimit:          64,
		ResyncInterval:     Duration{60 * time.Second},
	}
}

// toJSON is apimachinery's yaml.ToJSON: JSON input (after Unicode white space) passes as is.
func toJSON(data []byte) (out []byte, fromYAML bool, err error) {
	if bytes.HasPrefix(bytes.TrimLeftFunc(data, unicode.IsSpace), []byte("{")) {
		return data, false, nil
	}
	out, err = yaml.YAMLToJSON(data)
	return out, true, err
}

// varies tells whether YAMLToJSON's output changes from run to run: it does where two YAML
// keys become the same JSON key (1 and "1"), which one wins follows Go's map order. Large
// documents (the nesting and alias limits) are not asked again: they have no such keys.
func varies(data, first []byte) bool {
	for i := 0; i < 100 && len(data) < 10000; i++ {
		if again, _ := yaml.YAMLToJSON(data); !bytes.Equal(again, first) {
			return true
		}
	}
	return false
}

func (c *MasqConfig) validate(enableIPv6 bool) error {
	if n := len(c.NonMasqueradeCIDRs); n > c.CidrLimit {
		return fmt.Errorf("the daemon can only accept up to %d CIDRs (excluding link-local), but got %d CIDRs (excluding link local)", c.CidrLimit, n)
	}
	for _, cidr := range c.NonMasqueradeCIDRs {
		ip, ipnet, err := net.ParseCIDR(cidr)
		if err != nil {
			return fmt.Errorf("CIDR %q could not be parsed, %v", cidr, err)
		}
		if !ip.Equal(ipnet.IP) {
			return fmt.Errorf("CIDR %q is not aligned to a CIDR block, ip: %q network: %q", cidr, ip, ipnet.String())
		}
		if !enableIPv6 && net.ParseIP(ip.String()).To4() == nil {
			return fmt.Errorf("ipv6 is not enabled, but ipv6 cidr %s provided. Enable ipv6 using --enable-ipv6 agent flag", cidr)
		}
	}
	return nil
}

// accepted is the normalized form of an accepted config: the CIDR list as json.Marshal writes
// it (a nil list is null, an empty one []), and the interval is Go's Duration.String. Logged
// is json.Marshal of the whole config, which upstream logs.
type accepted struct {
	Cidrs             []string `json:"cidrs"`
	CidrLimit         int      `json:"cidrLimit"`
	MasqLinkLocal     bool     `json:"masqLinkLocal"`
	MasqLinkLocalIPv6 bool     `json:"masqLinkLocalIPv6"`
	ResyncInterval    string   `json:"resyncInterval"`
	Logged            string   `json:"logged"`
}

type input struct {
	Routine  string `json:"routine"`
	Input    string `json:"input"`
	B64      string `json:"b64"`
	Arg      int    `json:"arg"`
	Doc      string `json:"doc"`
	IPv6     bool   `json:"ipv6"`
	Reserved bool   `json:"reserved"`
}

type record struct {
	ID       string    `json:"id"`
	Doc      string    `json:"doc"`
	IPv6     bool      `json:"ipv6"`
	Reserved bool      `json:"reserved"`
	YAMLJSON *string   `json:"yaml_json,omitempty"`
	OK       *accepted `json:"ok,omitempty"`
	Err      *string   `json:"err,omitempty"`
}

func run(doc []byte, enableIPv6, reserved bool, rec *record) {
	fail := func(err error) {
		text := err.Error()
		rec.Err = &text
	}
	converted, fromYAML, err := toJSON(doc)
	if err != nil {
		fail(err)
		return
	}
	if fromYAML && !varies(doc, converted) {
		text := string(converted)
		rec.YAMLJSON = &text
	}
	c := defaults(reserved)
	if err := json.Unmarshal(converted, c); err != nil {
		fail(err)
		return
	}
	if err := c.validate(enableIPv6); err != nil {
		fail(err)
		return
	}
	logged, err := json.Marshal(c)
	if err != nil {
		fail(err)
		return
	}
	rec.OK = &accepted{c.NonMasqueradeCIDRs, c.CidrLimit, c.MasqLinkLocal, c.MasqLinkLocalIPv6,
		c.ResyncInterval.String(), string(logged)}
}

// routineRecord is one line of routines.jsonl.
type routineRecord struct {
	Routine string  `json:"routine"`
	Input   string  `json:"input,omitempty"`
	B64     string  `json:"b64,omitempty"`
	Arg     int     `json:"arg,omitempty"`
	Out     *string `json:"out,omitempty"`
	Err     *string `json:"err,omitempty"`
}

// jsonTokens reads a valid JSON document token by token (members in order, duplicates kept,
// numbers as written) and writes each token followed by a space, strings as json.Marshal does.
func jsonTokens(data []byte) (string, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var b strings.Builder
	for {
		token, err := dec.Token()
		if err == io.EOF {
			return b.String(), nil
		} else if err != nil {
			return "", err
		}
		switch v := token.(type) {
		case json.Delim:
			b.WriteString(v.String())
		case string:
			quoted, _ := json.Marshal(v)
			b.Write(quoted)
		case nil:
			b.WriteString("null")
		default:
			fmt.Fprint(&b, v)
		}
		b.WriteByte(' ')
	}
}

func parseFloat(s string) float64 {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		panic(err)
	}
	return f
}

// routine runs the named Go function on input.
func routine(name string, input []byte, arg int) (string, error) {
	s := string(input)
	switch name {
	case "strconv.Quote":
		return strconv.Quote(s), nil
	case "strconv.Atoi":
		n, err := strconv.Atoi(s)
		return strconv.Itoa(n), err
	case "strconv.ParseInt":
		n, err := strconv.ParseInt(s, arg, 64)
		return strconv.FormatInt(n, 10), err
	case "strconv.ParseUint":
		n, err := strconv.ParseUint(s, arg, 64)
		return strconv.FormatUint(n, 10), err
	case "strconv.ParseFloat": // the result's bits
		f, err := strconv.ParseFloat(s, 64)
		return strconv.FormatUint(math.Float64bits(f), 10), err
	case "strconv.FormatFloat": // 'g', shortest, arg bits, of the float64 the input spells
		return strconv.FormatFloat(parseFloat(s), 'g', -1, arg), nil
	case "json.Marshal(float64)":
		out, err := json.Marshal(parseFloat(s))
		return string(out), err
	case "time.ParseDuration": // nanoseconds
		d, err := time.ParseDuration(s)
		return strconv.FormatInt(int64(d), 10), err
	case "time.Duration.String": // of the input's nanoseconds
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			panic(err)
		}
		return time.Duration(n).String(), nil
	case "net.ParseCIDR": // ip, network, ip.Equal(network.IP) and, aligned, upstream's family test
		ip, ipnet, err := net.ParseCIDR(s)
		if err != nil {
			return "", err
		}
		out := fmt.Sprintf("%s %s %t", ip, ipnet, ip.Equal(ipnet.IP))
		if ip.Equal(ipnet.IP) {
			out += fmt.Sprintf(" ipv4=%t", net.ParseIP(ip.String()).To4() != nil)
		}
		return out, nil
	case "json.Unmarshal": // the syntax error, or the document's tokens
		if err := json.Unmarshal(input, &json.RawMessage{}); err != nil {
			return "", err
		}
		return jsonTokens(input)
	}
	panic("unknown routine " + name)
}

func runRoutine(line input) routineRecord {
	data := []byte(line.Input)
	if line.B64 != "" {
		var err error
		if data, err = base64.StdEncoding.DecodeString(line.B64); err != nil {
			panic(err)
		}
	}
	rec := routineRecord{Routine: line.Routine, Input: line.Input, B64: line.B64, Arg: line.Arg}
	out, err := routine(line.Routine, data, line.Arg)
	if err != nil {
		text := err.Error()
		rec.Err = &text
	} else {
		rec.Out = &out
	}
	return rec
}

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<24)
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	seen := map[string]bool{}
	for in.Scan() {
		var line input
		if err := json.Unmarshal(in.Bytes(), &line); err != nil {
			fmt.Fprintln(os.Stderr, "bad input line:", err)
			os.Exit(1)
		}
		if line.Routine != "" {
			encoded, _ := json.Marshal(runRoutine(line))
			out.Write(encoded)
			out.WriteByte('\n')
			continue
		}
		doc, err := base64.StdEncoding.DecodeString(line.Doc)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bad base64:", err)
			os.Exit(1)
		}
		// The id names a case in masq's allow-list, so it depends only on the case itself.
		sum := sha256.Sum256([]byte(fmt.Sprintf("%t %t %s", line.IPv6, line.Reserved, doc)))
		id := hex.EncodeToString(sum[:6])
		if seen[id] {
			continue
		}
		seen[id] = true
		rec := record{ID: id, Doc: line.Doc, IPv6: line.IPv6, Reserved: line.Reserved}
		run(doc, line.IPv6, line.Reserved, &rec)
		encoded, err := json.Marshal(rec)
		if err != nil {
			fmt.Fprintln(os.Stderr, "encoding:", err)
			os.Exit(1)
		}
		out.Write(encoded)
		out.WriteByte('\n')
	}
	if err := in.Err(); err != nil {
		fmt.Fprintln(os.Stderr, "reading:", err)
		os.Exit(1)
	}
}
