package harness

import (
	"bufio"
	"fmt"
	"strconv"
	"strings"
)

// Sample is one line of the Prometheus text format.
type Sample struct {
	Labels map[string]string
	Value  float64
}

// Metrics is a parsed /metrics page: samples by metric name.
type Metrics map[string][]Sample

// Sum adds the samples of name whose labels match every key=value pair given
// (labelPairs alternate key, value).
func (m Metrics) Sum(name string, labelPairs ...string) float64 {
	var sum float64
	for _, s := range m[name] {
		ok := true
		for i := 0; i+1 < len(labelPairs); i += 2 {
			if s.Labels[labelPairs[i]] != labelPairs[i+1] {
				ok = false
				break
			}
		}
		if ok {
			sum += s.Value
		}
	}
	return sum
}

// ParseMetrics parses the Prometheus text exposition format (enough of it for
// counters, gauges and histograms; comments and timestamps are ignored).
func ParseMetrics(text string) (Metrics, error) {
	m := Metrics{}
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 1<<16), 1<<22)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		name, labels, rest, err := splitSample(line)
		if err != nil {
			return nil, fmt.Errorf("metrics line %d: %w: %q", n, err, line)
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			return nil, fmt.Errorf("metrics line %d: no value: %q", n, line)
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %d: value: %w", n, err)
		}
		m[name] = append(m[name], Sample{Labels: labels, Value: v})
	}
	return m, sc.Err()
}

func splitSample(line string) (name string, labels map[string]string, rest string, err error) {
	i := strings.IndexAny(line, "{ \t")
	if i < 0 {
		return "", nil, "", fmt.Errorf("no value")
	}
	name = line[:i]
	labels = map[string]string{}
	if line[i] != '{' {
		return name, labels, line[i:], nil
	}
	s := line[i+1:]
	for {
		s = strings.TrimLeft(s, " ,")
		if strings.HasPrefix(s, "}") {
			return name, labels, s[1:], nil
		}
		eq := strings.IndexByte(s, '=')
		if eq < 0 || len(s) < eq+2 || s[eq+1] != '"' {
			return "", nil, "", fmt.Errorf("bad label")
		}
		key := strings.TrimSpace(s[:eq])
		s = s[eq+2:]
		var b strings.Builder
		j := 0
		for ; j < len(s); j++ {
			c := s[j]
			if c == '\\' && j+1 < len(s) {
				j++
				switch s[j] {
				case 'n':
					b.WriteByte('\n')
				default:
					b.WriteByte(s[j])
				}
				continue
			}
			if c == '"' {
				break
			}
			b.WriteByte(c)
		}
		if j >= len(s) {
			return "", nil, "", fmt.Errorf("unterminated label value")
		}
		labels[key] = b.String()
		s = s[j+1:]
	}
}
