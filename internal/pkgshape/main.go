// Command pkgshape measures how a package's helper types depend on its
// central type, and how its files depend on each other. Run it from the
// module root:
//
//	go run ./internal/pkgshape [-v] [-type Node] ./node
//
// It type-checks the package's non-test files (default build tags) against
// the export data `go list -export` produces, and prints:
//
//   - helpers: the struct types (other than the central type) with a field
//     of type *T (T the central type, Node by default), how many methods
//     they have, and how many selector expressions (x.f, x.m()) inside those
//     methods are taken on a *T or T value: the reaches back into T;
//   - reaches elsewhere: the same selectors in plain functions and other
//     types' methods (T's own methods not counted);
//   - file arrows: file A uses file B when A names a package-level object
//     (type, function, variable, constant), a method or a struct field
//     declared in B. The files are put in the order (top: users; bottom:
//     used) that leaves the fewest arrows pointing up (greedy
//     feedback-arc-set ordering of Eades, Lin and Smyth, then single-file
//     moves while they remove one); the arrows that still point up, from a
//     lower file to a higher one, are the back-up arrows. An arrow is one
//     (user file, used file) pair, however many names it carries.
//
// -v lists the back-up arrows and each helper's reaches by name.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

type listPkg struct {
	ImportPath string
	Dir        string
	GoFiles    []string
	Export     string
}

func main() {
	verbose := flag.Bool("v", false, "list the back-up arrows and the reaches by name")
	central := flag.String("type", "Node", "the central type")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: go run ./internal/pkgshape [-v] [-type Node] ./pkg")
		os.Exit(2)
	}
	if err := run(flag.Arg(0), *central, *verbose, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "pkgshape:", err)
		os.Exit(1)
	}
}

func run(pattern, central string, verbose bool, w io.Writer) error {
	out, err := exec.Command("go", "list", "-export", "-deps", "-json", pattern).Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return fmt.Errorf("go list: %v\n%s", err, ee.Stderr)
		}
		return err
	}
	exports := map[string]string{}
	var target listPkg
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var p listPkg
		if err := dec.Decode(&p); err != nil {
			return err
		}
		exports[p.ImportPath] = p.Export
		target = p // the last one listed is the package itself
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, name := range target.GoFiles {
		f, err := parser.ParseFile(fset, filepath.Join(target.Dir, name), nil, 0)
		if err != nil {
			return err
		}
		files = append(files, f)
	}
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		p, ok := exports[path]
		if !ok || p == "" {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(p)
	})
	info := &types.Info{
		Uses:       map[*ast.Ident]types.Object{},
		Defs:       map[*ast.Ident]types.Object{},
		Selections: map[*ast.SelectorExpr]*types.Selection{},
		Types:      map[ast.Expr]types.TypeAndValue{},
	}
	pkg, err := (&types.Config{Importer: imp}).Check(target.ImportPath, fset, files, info)
	if err != nil {
		return err
	}
	cobj, _ := pkg.Scope().Lookup(central).(*types.TypeName)
	if cobj == nil {
		return fmt.Errorf("no type %s in %s", central, target.ImportPath)
	}
	ctype := cobj.Type()
	isCentral := func(t types.Type) bool {
		if p, ok := t.(*types.Pointer); ok {
			t = p.Elem()
		}
		return types.Identical(t, ctype)
	}

	// Helper types: named structs with a field of type *central.
	helpers := map[*types.TypeName]bool{}
	for _, name := range pkg.Scope().Names() {
		tn, ok := pkg.Scope().Lookup(name).(*types.TypeName)
		if !ok || tn == cobj {
			continue
		}
		st, ok := tn.Type().Underlying().(*types.Struct)
		if !ok {
			continue
		}
		for i := range st.NumFields() {
			if isCentral(st.Field(i).Type()) {
				helpers[tn] = true
			}
		}
	}
	type hstat struct {
		methods int
		reaches int
		names   map[string]int
	}
	hs := map[*types.TypeName]*hstat{}
	for tn := range helpers {
		hs[tn] = &hstat{names: map[string]int{}}
	}
	elsewhere := 0
	elseNames := map[string]int{}
	for _, f := range files {
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			var owner *types.TypeName
			if fd.Recv != nil {
				rt := info.Types[fd.Recv.List[0].Type].Type
				if p, ok := rt.(*types.Pointer); ok {
					rt = p.Elem()
				}
				if nt, ok := rt.(*types.Named); ok {
					owner = nt.Obj()
				}
			}
			if owner == cobj {
				continue
			}
			h := hs[owner]
			if h != nil {
				h.methods++
			}
			ast.Inspect(fd.Body, func(x ast.Node) bool {
				se, ok := x.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				sel := info.Selections[se]
				if sel == nil || !isCentral(sel.Recv()) {
					return true
				}
				if h != nil {
					h.reaches++
					h.names[se.Sel.Name]++
				} else {
					elsewhere++
					elseNames[se.Sel.Name]++
				}
				return true
			})
		}
	}
	var hnames []*types.TypeName
	for tn := range helpers {
		hnames = append(hnames, tn)
	}
	sort.Slice(hnames, func(i, j int) bool {
		if hs[hnames[i]].reaches != hs[hnames[j]].reaches {
			return hs[hnames[i]].reaches > hs[hnames[j]].reaches
		}
		return hnames[i].Name() < hnames[j].Name()
	})
	totM, totR := 0, 0
	fmt.Fprintf(w, "helper types holding *%s:\n", central)
	for _, tn := range hnames {
		h := hs[tn]
		totM += h.methods
		totR += h.reaches
		fmt.Fprintf(w, "  %-18s %3d methods %4d reaches  (%s)\n", tn.Name(), h.methods, h.reaches,
			filepath.Base(fset.Position(tn.Pos()).Filename))
		if verbose {
			fmt.Fprintf(w, "      %s\n", byCount(h.names))
		}
	}
	fmt.Fprintf(w, "helpers: %d types, %d methods, %d reaches back into %s\n", len(hnames), totM, totR, central)
	fmt.Fprintf(w, "reaches into %s from other functions and methods: %d\n", central, elsewhere)
	if verbose {
		fmt.Fprintf(w, "      %s\n", byCount(elseNames))
	}

	// File graph.
	fileOf := func(pos token.Pos) string { return filepath.Base(fset.Position(pos).Filename) }
	var names []string
	for _, f := range files {
		names = append(names, fileOf(f.Pos()))
	}
	edges := map[[2]string]int{}
	edgeNames := map[[2]string]map[string]int{}
	for _, f := range files {
		from := fileOf(f.Pos())
		for id, obj := range info.Uses {
			if obj == nil || obj.Pkg() != pkg || fileOf(id.Pos()) != from {
				continue
			}
			if !declaredAtPackageLevel(obj, pkg) {
				continue
			}
			to := fileOf(obj.Pos())
			if to != from {
				e := [2]string{from, to}
				edges[e]++
				if edgeNames[e] == nil {
					edgeNames[e] = map[string]int{}
				}
				edgeNames[e][obj.Name()]++
			}
		}
	}
	order := orderFiles(names, edges)
	rank := map[string]int{}
	for i, n := range order {
		rank[n] = i
	}
	var back [][2]string
	for e := range edges {
		if rank[e[0]] > rank[e[1]] {
			back = append(back, e)
		}
	}
	slices.SortFunc(back, func(a, b [2]string) int { return strings.Compare(a[0]+" "+a[1], b[0]+" "+b[1]) })
	fmt.Fprintf(w, "files: %d, arrows between files: %d, back-up arrows: %d\n", len(names), len(edges), len(back))
	if verbose {
		fmt.Fprintf(w, "order (top first): %s\n", strings.Join(order, " "))
		for _, e := range back {
			fmt.Fprintf(w, "  back up: %s -> %s (%d uses: %s)\n", e[0], e[1], edges[e], byCount(edgeNames[e]))
		}
	}
	return nil
}

// declaredAtPackageLevel reports whether obj is a package-level object of
// pkg, a method or a struct field (of a type declared in pkg).
func declaredAtPackageLevel(obj types.Object, pkg *types.Package) bool {
	switch o := obj.(type) {
	case *types.Func:
		if sig, ok := o.Type().(*types.Signature); ok && sig.Recv() != nil {
			return true
		}
		return o.Parent() == pkg.Scope()
	case *types.Var:
		if o.IsField() {
			return true
		}
		return o.Parent() == pkg.Scope()
	case *types.Const, *types.TypeName:
		return o.Parent() == pkg.Scope()
	}
	return false
}

// orderFiles orders the files so that few arrows (user -> used) point from
// a later file to an earlier one: Eades-Lin-Smyth, then moves of single
// files while one lowers the count. Ties break by name: the order is
// deterministic.
func orderFiles(names []string, edges map[[2]string]int) []string {
	out := map[string]map[string]bool{}
	in := map[string]map[string]bool{}
	for _, n := range names {
		out[n], in[n] = map[string]bool{}, map[string]bool{}
	}
	for e := range edges {
		out[e[0]][e[1]] = true
		in[e[1]][e[0]] = true
	}
	left := map[string]bool{}
	for _, n := range names {
		left[n] = true
	}
	deg := func(m map[string]bool) int {
		c := 0
		for k := range m {
			if left[k] {
				c++
			}
		}
		return c
	}
	sorted := func() []string {
		var s []string
		for n := range left {
			s = append(s, n)
		}
		sort.Strings(s)
		return s
	}
	var head, tail []string
	for len(left) > 0 {
		changed := true
		for changed {
			changed = false
			for _, n := range sorted() {
				if deg(in[n]) == 0 { // nothing left uses n... n uses others: a source goes first
					head = append(head, n)
					delete(left, n)
					changed = true
				} else if deg(out[n]) == 0 {
					tail = append([]string{n}, tail...)
					delete(left, n)
					changed = true
				}
			}
		}
		if len(left) == 0 {
			break
		}
		best, bestD := "", 0
		for _, n := range sorted() {
			if d := deg(out[n]) - deg(in[n]); best == "" || d > bestD {
				best, bestD = n, d
			}
		}
		head = append(head, best)
		delete(left, best)
	}
	order := append(head, tail...)
	count := func(o []string) int {
		r := map[string]int{}
		for i, n := range o {
			r[n] = i
		}
		c := 0
		for e := range edges {
			if r[e[0]] > r[e[1]] {
				c++
			}
		}
		return c
	}
	cur := count(order)
	for improved := true; improved; {
		improved = false
		for i := range order {
			for j := range order {
				if i == j {
					continue
				}
				o := slices.Clone(order)
				n := o[i]
				o = slices.Delete(o, i, i+1)
				o = slices.Insert(o, j, n)
				if c := count(o); c < cur {
					order, cur, improved = o, c, true
				}
			}
		}
	}
	return order
}

func byCount(m map[string]int) string {
	type kv struct {
		k string
		v int
	}
	var s []kv
	for k, v := range m {
		s = append(s, kv{k, v})
	}
	sort.Slice(s, func(i, j int) bool {
		if s[i].v != s[j].v {
			return s[i].v > s[j].v
		}
		return s[i].k < s[j].k
	})
	var b strings.Builder
	for _, e := range s {
		fmt.Fprintf(&b, "%s:%d ", e.k, e.v)
	}
	return b.String()
}
