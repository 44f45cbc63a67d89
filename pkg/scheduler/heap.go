package scheduler

// timerHeap is a min-heap of schedules by the time their next fire is due
// (Unix nanoseconds). Each entry knows its index, so a schedule can be moved
// or removed in O(log n) when its definition or state changes; the leader
// only ever looks at the top, never at every schedule.
type timerHeap struct {
	items []*entry
}

func (h *timerHeap) Len() int { return len(h.items) }

func (h *timerHeap) peek() *entry { return h.items[0] }

// set places en at due, inserting or moving it.
func (h *timerHeap) set(en *entry, due int64) {
	if en.heapIdx >= 0 {
		old := en.due
		en.due = due
		if due < old {
			h.up(int(en.heapIdx))
		} else {
			h.down(int(en.heapIdx))
		}
		return
	}
	en.due = due
	en.heapIdx = int32(len(h.items))
	h.items = append(h.items, en)
	h.up(len(h.items) - 1)
}

// remove takes en out of the heap if it is in it.
func (h *timerHeap) remove(en *entry) {
	i := int(en.heapIdx)
	if i < 0 {
		return
	}
	last := len(h.items) - 1
	if i != last {
		h.swap(i, last)
	}
	h.items[last] = nil
	h.items = h.items[:last]
	en.heapIdx = -1
	if i != last {
		h.down(i)
		h.up(i)
	}
}

// pop removes and returns the earliest entry.
func (h *timerHeap) pop() *entry {
	en := h.items[0]
	h.remove(en)
	return en
}

func (h *timerHeap) less(i, j int) bool { return h.items[i].due < h.items[j].due }

func (h *timerHeap) swap(i, j int) {
	h.items[i], h.items[j] = h.items[j], h.items[i]
	h.items[i].heapIdx = int32(i)
	h.items[j].heapIdx = int32(j)
}

func (h *timerHeap) up(i int) {
	for i > 0 {
		parent := (i - 1) / 2
		if !h.less(i, parent) {
			return
		}
		h.swap(i, parent)
		i = parent
	}
}

func (h *timerHeap) down(i int) {
	n := len(h.items)
	for {
		smallest := i
		if l := 2*i + 1; l < n && h.less(l, smallest) {
			smallest = l
		}
		if r := 2*i + 2; r < n && h.less(r, smallest) {
			smallest = r
		}
		if smallest == i {
			return
		}
		h.swap(i, smallest)
		i = smallest
	}
}
