package gitlabsim

import (
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"maps"
	"sort"
	"strings"
	"time"
)

// commit is one commit of the in-memory repository: a full snapshot of the tree
// (path → content) and its parents. Snapshots share their strings, so a commit costs
// one map, which is fine at the sizes tests and the demo use.
type commit struct {
	sha       string
	parents   []string
	message   string
	files     map[string]string
	author    string
	email     string
	createdAt time.Time
	additions int
	deletions int
}

func (c *commit) title() string {
	t, _, _ := strings.Cut(c.message, "\n")
	return t
}

// trailers parses "Key: value" lines of the message's last paragraph, as git does.
func (c *commit) trailers() map[string]string {
	out := map[string]string{}
	paras := strings.Split(strings.TrimRight(c.message, "\n"), "\n\n")
	if len(paras) < 2 {
		return out
	}
	for line := range strings.SplitSeq(paras[len(paras)-1], "\n") {
		k, v, ok := strings.Cut(line, ": ")
		if !ok || k == "" || strings.ContainsAny(k, " \t") {
			continue
		}
		out[k] = v
	}
	return out
}

// blobID is git's object id of a blob with this content, so tree listings show the
// same ids real GitLab would.
func blobID(content string) string {
	h := sha1.New()
	fmt.Fprintf(h, "blob %d\x00", len(content))
	h.Write([]byte(content))
	return hex.EncodeToString(h.Sum(nil))
}

func treeID(path string, files map[string]string) string {
	h := sha1.New()
	prefix := path + "/"
	if path == "" {
		prefix = ""
	}
	keys := make([]string, 0)
	for p := range files {
		if strings.HasPrefix(p, prefix) {
			keys = append(keys, p)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(h, "%s\x00%s\n", k, blobID(files[k]))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// ancestors returns every commit reachable from sha (sha included).
func (s *Sim) ancestors(sha string) map[string]bool {
	seen := map[string]bool{}
	stack := []string{sha}
	for len(stack) > 0 {
		cur := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if cur == "" || seen[cur] {
			continue
		}
		seen[cur] = true
		if c := s.commits[cur]; c != nil {
			stack = append(stack, c.parents...)
		}
	}
	return seen
}

// mergeBase is the nearest common ancestor of a and b (breadth-first from b).
func (s *Sim) mergeBase(a, b string) string {
	inA := s.ancestors(a)
	queue := []string{b}
	seen := map[string]bool{}
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		if cur == "" || seen[cur] {
			continue
		}
		seen[cur] = true
		if inA[cur] {
			return cur
		}
		if c := s.commits[cur]; c != nil {
			queue = append(queue, c.parents...)
		}
	}
	return ""
}

// change is one path's new value relative to a base; deleted when del.
type change struct {
	content string
	del     bool
}

func diffFiles(base, head map[string]string) map[string]change {
	out := map[string]change{}
	for p, v := range head {
		if bv, ok := base[p]; !ok || bv != v {
			out[p] = change{content: v}
		}
	}
	for p := range base {
		if _, ok := head[p]; !ok {
			out[p] = change{del: true}
		}
	}
	return out
}

// mergeResult computes what merging source into target gives: the merged tree, the
// paths that conflict (changed on both sides since the merge base, differently), and
// the MR's own changes.
func (s *Sim) mergeResult(targetSHA, sourceSHA string) (merged map[string]string, conflicts []string, mrChanges map[string]change) {
	base := s.mergeBase(targetSHA, sourceSHA)
	var baseFiles map[string]string
	if bc := s.commits[base]; bc != nil {
		baseFiles = bc.files
	}
	src := s.commits[sourceSHA]
	tgt := s.commits[targetSHA]
	if src == nil || tgt == nil {
		return nil, nil, nil
	}
	mrChanges = diffFiles(baseFiles, src.files)
	tgtChanges := diffFiles(baseFiles, tgt.files)
	for p, mc := range mrChanges {
		if tc, ok := tgtChanges[p]; ok && tc != mc {
			conflicts = append(conflicts, p)
		}
	}
	sort.Strings(conflicts)
	merged = maps.Clone(tgt.files)
	if merged == nil {
		merged = map[string]string{}
	}
	for p, mc := range mrChanges {
		if mc.del {
			delete(merged, p)
		} else {
			merged[p] = mc.content
		}
	}
	return merged, conflicts, mrChanges
}

// newCommit stores a commit and returns it. The sha is derived from a counter and the
// content, so it is unique and looks like a git sha.
func (s *Sim) newCommit(parents []string, message string, files map[string]string) *commit {
	s.commitSeq++
	h := sha1.New()
	fmt.Fprintf(h, "%d\x00%s\x00%s", s.commitSeq, strings.Join(parents, ","), message)
	var parentFiles map[string]string
	if len(parents) > 0 {
		if pc := s.commits[parents[0]]; pc != nil {
			parentFiles = pc.files
		}
	}
	add, del := 0, 0
	for _, ch := range diffFiles(parentFiles, files) {
		if ch.del {
			del++
		} else {
			add++
		}
	}
	c := &commit{
		sha:       hex.EncodeToString(h.Sum(nil)),
		parents:   parents,
		message:   message,
		files:     files,
		author:    s.user.Name,
		email:     s.user.Email,
		createdAt: s.now(),
		additions: add,
		deletions: del,
	}
	s.commits[c.sha] = c
	return c
}
