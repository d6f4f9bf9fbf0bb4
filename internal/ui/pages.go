package ui

import (
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"time"

	"github.com/batcherd/batcherd/internal/domain"
	"github.com/batcherd/batcherd/internal/store"
)

func (h *Handler) parse() error {
	funcs := template.FuncMap{
		"ts":       fmtTime,
		"tsp":      func(t *time.Time) string { return fmtTimeP(t) },
		"ago":      func(now, t time.Time) string { return fmtAge(now.Sub(t)) },
		"agop":     func(now time.Time, t *time.Time) string { return fmtAgeP(now, t) },
		"opURL":    func(id string) string { return "/ui/operations/" + url.PathEscape(id) },
		"batchURL": func(id int64) string { return "/ui/batches/" + strconv.FormatInt(id, 10) },
		"batchesURL": func(repo string, before int64) string {
			q := url.Values{}
			if repo != "" {
				q.Set("repo", repo)
			}
			if before > 0 {
				q.Set("before", strconv.FormatInt(before, 10))
			}
			if len(q) == 0 {
				return "/ui/batches"
			}
			return "/ui/batches?" + q.Encode()
		},
		"bstatus": func(s domain.BatchStatus) string { return s.String() },
		"deref":   func(p *int64) int64 { return *p },
		"ideref":  func(p *int) int { return *p },
	}
	h.pages = map[string]*template.Template{}
	for _, p := range []string{"login", "error", "repos", "batches", "batch", "operation"} {
		t, err := template.New("").Funcs(funcs).ParseFS(assets, "templates/layout.html", "templates/partials.html", "templates/"+p+".html")
		if err != nil {
			return fmt.Errorf("ui: template %s: %w", p, err)
		}
		h.pages[p] = t
	}
	return nil
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "–"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

func fmtTimeP(t *time.Time) string {
	if t == nil {
		return "–"
	}
	return fmtTime(*t)
}

func fmtAgeP(now time.Time, t *time.Time) string {
	if t == nil {
		return "–"
	}
	return fmtAge(now.Sub(*t))
}

// fmtAge: "42s", "7m03s", "5h12m", "3d04h".
func fmtAge(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	default:
		return fmt.Sprintf("%dd%02dh", int(d.Hours())/24, int(d.Hours())%24)
	}
}

// repoRow is one repository on the first page.
type repoRow struct {
	store.RepoState
	// Health is the repository's repo_state row (zero before a replica recorded one).
	Health store.RepoHealth
	// Active is the active batch (nil when the slot is free).
	Active *domain.Batch
}

type reposData struct {
	base
	Repos       []repoRow
	HealthKnown bool
	Recent      []domain.Batch
}

// repos: GET /ui — every configured repository (waiting depth and age, pause, GitLab
// state, drift, active batch) and the latest batches. Reads: RepoStates (three indexed
// reads), one row per active batch (at most one per repository), the health rows when
// wired, and the first page of batches.
func (h *Handler) repos(w http.ResponseWriter, r *http.Request, s Session) error {
	ctx := r.Context()
	states, err := h.st.RepoStates(ctx, h.cfg.Repos)
	if err != nil {
		return err
	}
	health, err := h.st.RepoHealths(ctx)
	if err != nil {
		return err
	}
	d := reposData{base: h.base(s, "Repositories")}
	d.Nav = "repos"
	for _, st := range states {
		row := repoRow{RepoState: st, Health: health[st.Repo]}
		if id := st.ActiveBatchID; id != nil {
			// The batch row alone, one indexed read (BatchGet would read its member
			// list too): the repository's newest batch with an id up to the active one.
			bs, err := h.st.BatchList(ctx, store.BatchFilter{Repo: st.Repo, AfterID: *id + 1, Limit: 1})
			if err != nil {
				return err
			}
			if len(bs) == 1 && bs[0].ID == *id {
				row.Active = &bs[0]
			}
		}
		d.Repos = append(d.Repos, row)
	}
	if d.Recent, err = h.st.BatchList(ctx, store.BatchFilter{Limit: 10}); err != nil {
		return err
	}
	h.render(w, r, http.StatusOK, "repos", d)
	return nil
}

func isNotFound(err error) bool { return errors.Is(err, store.ErrNotFound) }

type batchesData struct {
	base
	Repos   []string
	Repo    string
	Batches []domain.Batch
	Before  int64
	// Next is the cursor of the next (older) page; 0 on the last page.
	Next int64
}

// batches: GET /ui/batches?repo=&before= — newest first, pageSize a page, keyset paged
// by id (BatchList: idx_repo_id with a repository, the primary key without).
func (h *Handler) batches(w http.ResponseWriter, r *http.Request, s Session) error {
	q := r.URL.Query()
	d := batchesData{base: h.base(s, "Batches"), Repos: h.cfg.Repos, Repo: q.Get("repo")}
	d.Nav = "batches"
	if d.Repo != "" && !slices.Contains(h.cfg.Repos, d.Repo) {
		return &pageError{http.StatusBadRequest, "That repository is not configured."}
	}
	if v := q.Get("before"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 {
			return &pageError{http.StatusBadRequest, "The page cursor is not one this page made."}
		}
		d.Before = n
	}
	bs, err := h.st.BatchList(r.Context(), store.BatchFilter{Repo: d.Repo, AfterID: d.Before, Limit: pageSize + 1})
	if err != nil {
		return err
	}
	if len(bs) > pageSize {
		bs = bs[:pageSize]
		d.Next = bs[len(bs)-1].ID
	}
	d.Batches = bs
	h.render(w, r, http.StatusOK, "batches", d)
	return nil
}

type batchData struct {
	base
	Batch   domain.Batch
	Members []domain.Operation
	Total   int
}

// maxMembersShown bounds the members table of a batch page.
const maxMembersShown = 500

// batch: GET /ui/batches/{id} — the batch and its members.
func (h *Handler) batch(w http.ResponseWriter, r *http.Request, s Session) error {
	id, ok := pathID(r)
	if !ok {
		return notFound("No such batch.")
	}
	b, err := h.st.BatchGet(r.Context(), id)
	if err != nil {
		if isNotFound(err) {
			return notFound("Batch %d does not exist.", id)
		}
		return err
	}
	ms, err := h.st.BatchMembers(r.Context(), id)
	if err != nil {
		return err
	}
	d := batchData{base: h.base(s, fmt.Sprintf("Batch %d", id)), Batch: b, Members: ms, Total: len(ms)}
	// Rendering is the cost of a big batch (a 500-member page renders in about 19 ms):
	// the first maxMembersShown are shown, so even BATCHERD_MAX_BATCH_SIZE=5000 stays
	// well under 100 ms; GET /v1/batches/{id} lists every member.
	if len(ms) > maxMembersShown {
		d.Members = ms[:maxMembersShown]
	}
	d.Nav = "batches"
	h.render(w, r, http.StatusOK, "batch", d)
	return nil
}

type operationData struct {
	base
	Op     store.OperationView
	Events []store.Event
}

// operation: GET /ui/operations/{id} — the operation and its timeline.
func (h *Handler) operation(w http.ResponseWriter, r *http.Request, s Session) error {
	id := r.PathValue("id")
	if len(id) > 64 {
		return notFound("No such operation.")
	}
	op, err := h.st.OperationGetView(r.Context(), id)
	if err != nil {
		if isNotFound(err) {
			return notFound("No such operation.")
		}
		return err
	}
	evs, err := h.st.OperationEvents(r.Context(), id)
	if err != nil && !isNotFound(err) {
		return err
	}
	d := operationData{base: h.base(s, "Operation"), Op: op, Events: evs}
	h.render(w, r, http.StatusOK, "operation", d)
	return nil
}
