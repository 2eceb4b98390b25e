//go:build linux

package lazyfs

import (
	"io"
	"os"
	"sync"
)

// overlay is one backing file's unsynced state: the pages written since
// its last sync and its size. Reads see the backing file below floor
// (everything above it was truncated away since the sync, so it reads as
// zeros) with the dirty pages on top, up to size.
type overlay struct {
	refs int // open handles (FS.mu)

	mu    sync.Mutex
	f     *os.File // the filesystem's own handle on the backing file
	sz    int64    // the file's size as its readers see it
	floor int64    // backing bytes at or past floor are dead (a truncation)
	pages map[int64][]byte
	dirty bool // anything to sync: pages, or a size that differs
}

func newOverlay(f *os.File, size int64) *overlay {
	return &overlay{f: f, sz: size, floor: size, pages: make(map[int64][]byte)}
}

func (o *overlay) size() int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.sz
}

// pending is the number of bytes a cut would lose (a truncation counts as
// nothing, a dirty page as a whole page).
func (o *overlay) pending() int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := int64(len(o.pages)) * pageSize
	if n == 0 && o.dirty {
		n = 1
	}
	return n
}

// fill reads what the file holds in [off, off+len(p)) as of the last sync,
// before the dirty pages: the backing file below floor, zeros above it.
func (o *overlay) fill(p []byte, off int64) error {
	clear(p)
	if off >= o.floor {
		return nil
	}
	n := min(int64(len(p)), o.floor-off)
	_, err := o.f.ReadAt(p[:n], off)
	if err == io.EOF {
		err = nil // the backing file is shorter: zeros
	}
	return err
}

func (o *overlay) readAt(p []byte, off int64) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if off >= o.sz {
		return 0, nil
	}
	p = p[:min(int64(len(p)), o.sz-off)]
	if err := o.fill(p, off); err != nil {
		return 0, err
	}
	for pg := off / pageSize; pg*pageSize < off+int64(len(p)); pg++ {
		page, ok := o.pages[pg]
		if !ok {
			continue
		}
		start := pg * pageSize
		// Copy the overlap of the page [start, start+pageSize) and the
		// read [off, off+len(p)).
		from := max(start, off)
		to := min(start+pageSize, off+int64(len(p)))
		copy(p[from-off:to-off], page[from-start:to-start])
	}
	return len(p), nil
}

// page returns the dirty page pg, making it from the file's content if it
// is not dirty yet.
func (o *overlay) page(pg int64) []byte {
	if page, ok := o.pages[pg]; ok {
		return page
	}
	page := make([]byte, pageSize)
	start := pg * pageSize
	if start < o.sz {
		// Only what is inside the file: past its end a page is zeros.
		_ = o.fill(page[:min(pageSize, o.sz-start)], start)
	}
	o.pages[pg] = page
	return page
}

func (o *overlay) writeAt(data []byte, off int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	end := off + int64(len(data))
	for pg := off / pageSize; pg*pageSize < end; pg++ {
		page := o.page(pg)
		start := pg * pageSize
		from := max(start, off)
		to := min(start+pageSize, end)
		copy(page[from-start:to-start], data[from-off:to-off])
	}
	o.sz = max(o.sz, end)
	o.dirty = true
}

// truncate sets the file's size: pages past it go, the page it ends in is
// zeroed past it, and the backing file's bytes past it are dead until the
// next sync.
func (o *overlay) truncate(size int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if size < o.sz {
		for pg, page := range o.pages {
			start := pg * pageSize
			switch {
			case start >= size:
				delete(o.pages, pg)
			case start+pageSize > size:
				clear(page[size-start:])
			}
		}
		o.floor = min(o.floor, size)
	}
	o.sz = size
	o.dirty = true
}

// grow makes the file at least size bytes long (fallocate).
func (o *overlay) grow(size int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if size > o.sz {
		o.sz = size
		o.dirty = true
	}
}

// sync makes the overlay durable: the backing file gets the overlay's size
// (zeros where it was truncated and grown again) and every dirty page,
// then an fsync.
func (o *overlay) sync() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.dirty {
		return nil
	}
	fi, err := o.f.Stat()
	if err != nil {
		return err
	}
	if o.floor < fi.Size() {
		if err := o.f.Truncate(o.floor); err != nil {
			return err
		}
	}
	if err := o.f.Truncate(o.sz); err != nil {
		return err
	}
	for pg, page := range o.pages {
		start := pg * pageSize
		if start >= o.sz {
			continue
		}
		if _, err := o.f.WriteAt(page[:min(pageSize, o.sz-start)], start); err != nil {
			return err
		}
	}
	if err := o.f.Sync(); err != nil {
		return err
	}
	clear(o.pages)
	o.floor = o.sz
	o.dirty = false
	return nil
}

// drop forgets everything unsynced (a cut) and closes the handle; it
// returns the bytes lost.
func (o *overlay) drop() int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	lost := int64(len(o.pages)) * pageSize
	clear(o.pages)
	o.dirty = false
	o.f.Close()
	return lost
}

func (o *overlay) close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.f.Close()
}
