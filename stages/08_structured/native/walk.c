/* classify_position's walk (mask_cache.py) in C: the same pushdown automaton, the same verdicts.

   A Walker owns one grammar's pushdown automaton as pda.py builds it: stack nodes (position,
   parent) interned to ids, states (sorted sets of node ids and the sentinels END / UNKNOWN)
   interned to ids, and each state's 256 moves memoised in a dense row (-1: not taken yet).
   The automaton's tables (trans, calls, final, scannable, pure_end) are borrowed from Python's
   arrays (automaton.py's dense table, walker.py's flags and calls), read in place.

   walker_classify feeds the whole vocabulary, sorted by bytes, from a stack holding only `pos`
   over an unknown bottom. Sorted tokens share their prefixes with the token before them (lcp),
   so a token steps only the bytes past that shared prefix: one dense lookup per token-trie
   node. A token that shares the byte its predecessor died on dies with the same verdict. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define END (-1)
#define UNKNOWN (-2)
#define DEAD 0

/* What a loop (see chain() below) accepts without a walk, kept per walker by its bytes: a free
   string's characters are the same loop at every position of every free string of the grammar,
   and testing 49,152 tokens against it is most of such a position's walk. */
typedef struct {
    uint64_t inside[4];
    uint32_t *words;               /* the tokens it accepts (NULL: too few to be worth keeping) */
    int64_t count;
    int32_t *rest, *rest_lcp;      /* the other tokens, in order, each with its shared prefix */
    int64_t n_rest;                /* with the one of them before it */
} ChainTokens;
#define MAX_CHAINS 16

typedef struct {
    /* the automaton, borrowed */
    const int32_t *trans;      /* [n_pos * 256], -1 = no edge */
    const uint8_t *final, *scannable, *pure_end;
    const int64_t *call_off;   /* p's (callee, ret) pairs: call_pairs[2 * call_off[p] .. 2 * call_off[p + 1]) */
    const int32_t *call_pairs;
    /* stack nodes */
    int32_t *node_pos, *node_parent, *stamp;
    int64_t n_nodes, cap_nodes;
    int64_t *node_keys; int32_t *node_vals; int64_t node_table;  /* open addressing, key -1 = empty */
    int32_t cur_stamp;
    /* states */
    int32_t *members; int64_t n_members, cap_members;
    int64_t *state_off; uint8_t *has_unknown; int32_t *moves;
    int64_t n_states, cap_states;
    int32_t *state_table; int64_t state_table_size;              /* ids, -1 = empty */
    /* scratch */
    int32_t *todo, *out; int64_t cap_todo, cap_out;
    int64_t max_states, max_nodes;
    ChainTokens chains[MAX_CHAINS];   /* the tokens a loop accepts at once, by its bytes */
    int n_chains, next_chain;
} Walker;

static int grow(void **p, int64_t *cap, int64_t need, size_t size) {
    if (need <= *cap) return 0;
    int64_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, (size_t)c * size);
    if (!q) return -1;
    *p = q; *cap = c;
    return 0;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static uint64_t mix(uint64_t h) {  /* a 64-bit finaliser (splitmix) */
    h ^= h >> 31; h *= 0x7fb5d329728ea185ULL; h ^= h >> 27; h *= 0x81dadef4bc2dd44dULL; h ^= h >> 33;
    return h;
}

/* -------------------------------------------------------------- stack nodes */
static int rehash_nodes(Walker *w) {
    int64_t size = w->node_table ? w->node_table * 2 : 1024;
    int64_t *keys = malloc((size_t)size * sizeof(int64_t));
    int32_t *vals = malloc((size_t)size * sizeof(int32_t));
    if (!keys || !vals) { free(keys); free(vals); return -1; }
    memset(keys, 0xff, (size_t)size * sizeof(int64_t));
    for (int64_t i = 0; i < w->node_table; i++) {
        if (w->node_keys[i] < 0) continue;
        uint64_t h = mix((uint64_t)w->node_keys[i]) & (uint64_t)(size - 1);
        while (keys[h] >= 0) h = (h + 1) & (uint64_t)(size - 1);
        keys[h] = w->node_keys[i]; vals[h] = w->node_vals[i];
    }
    free(w->node_keys); free(w->node_vals);
    w->node_keys = keys; w->node_vals = vals; w->node_table = size;
    return 0;
}

/* The id of node (pos, parent), made if new; -1 when past the limits or out of memory. */
static int32_t node(Walker *w, int32_t pos, int32_t parent) {
    int64_t key = ((int64_t)pos << 32) | (uint32_t)(parent + 2);
    uint64_t mask = (uint64_t)(w->node_table - 1);
    uint64_t h = mix((uint64_t)key) & mask;
    while (w->node_keys[h] >= 0) {
        if (w->node_keys[h] == key) return w->node_vals[h];
        h = (h + 1) & mask;
    }
    if (w->n_nodes >= w->max_nodes) return -1;
    int64_t cap = w->cap_nodes;
    if (grow((void **)&w->node_pos, &cap, w->n_nodes + 1, sizeof(int32_t))) return -1;
    cap = w->cap_nodes;
    if (grow((void **)&w->node_parent, &cap, w->n_nodes + 1, sizeof(int32_t))) return -1;
    cap = w->cap_nodes;
    if (grow((void **)&w->stamp, &cap, w->n_nodes + 1, sizeof(int32_t))) return -1;
    if (cap > w->cap_nodes) memset(w->stamp + w->cap_nodes, 0, (size_t)(cap - w->cap_nodes) * sizeof(int32_t));
    w->cap_nodes = cap;
    int32_t id = (int32_t)w->n_nodes++;
    w->node_pos[id] = pos; w->node_parent[id] = parent;
    w->node_keys[h] = key; w->node_vals[h] = id;
    if (2 * w->n_nodes > w->node_table && rehash_nodes(w)) return -1;
    return id;
}

/* -------------------------------------------------------------- states */
static uint64_t hash_members(const int32_t *m, int64_t n) {
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ (uint64_t)n;
    for (int64_t i = 0; i < n; i++) h = mix(h ^ (uint32_t)m[i]);
    return h;
}

static int rehash_states(Walker *w) {
    int64_t size = w->state_table_size ? w->state_table_size * 2 : 1024;
    int32_t *table = malloc((size_t)size * sizeof(int32_t));
    if (!table) return -1;
    memset(table, 0xff, (size_t)size * sizeof(int32_t));
    for (int64_t s = 0; s < w->n_states; s++) {
        const int32_t *m = w->members + w->state_off[s];
        uint64_t h = hash_members(m, w->state_off[s + 1] - w->state_off[s]) & (uint64_t)(size - 1);
        while (table[h] >= 0) h = (h + 1) & (uint64_t)(size - 1);
        table[h] = (int32_t)s;
    }
    free(w->state_table);
    w->state_table = table; w->state_table_size = size;
    return 0;
}

/* The id of the state with these sorted members, made if new; -1 past the limits. */
static int32_t intern(Walker *w, const int32_t *m, int64_t n) {
    uint64_t mask = (uint64_t)(w->state_table_size - 1);
    uint64_t h = hash_members(m, n) & mask;
    while (w->state_table[h] >= 0) {
        int32_t s = w->state_table[h];
        int64_t len = w->state_off[s + 1] - w->state_off[s];
        if (len == n && !memcmp(w->members + w->state_off[s], m, (size_t)n * sizeof(int32_t))) return s;
        h = (h + 1) & mask;
    }
    if (w->n_states >= w->max_states) return -1;
    int64_t s = w->n_states;
    if (grow((void **)&w->members, &w->cap_members, w->n_members + n, sizeof(int32_t))) return -1;
    int64_t cap = w->cap_states;
    if (grow((void **)&w->state_off, &cap, s + 2, sizeof(int64_t))) return -1;
    cap = w->cap_states;
    if (grow((void **)&w->has_unknown, &cap, s + 2, sizeof(uint8_t))) return -1;
    if (cap > w->cap_states) {
        int32_t *moves = realloc(w->moves, (size_t)cap * 256 * sizeof(int32_t));
        if (!moves) return -1;
        w->moves = moves;
        w->cap_states = cap;
    }
    if (n) memcpy(w->members + w->n_members, m, (size_t)n * sizeof(int32_t));
    w->n_members += n;
    w->state_off[s + 1] = w->n_members;
    uint8_t unknown = 0;
    for (int64_t i = 0; i < n; i++) unknown |= m[i] == UNKNOWN;
    w->has_unknown[s] = unknown;
    memset(w->moves + s * 256, 0xff, 256 * sizeof(int32_t));
    w->n_states = s + 1;
    w->state_table[h] = (int32_t)s;
    if (2 * w->n_states > w->state_table_size && rehash_states(w)) return -1;
    return (int32_t)s;
}


static const int32_t *row_of(Walker *w, int32_t pos) {
    return w->trans + (int64_t)pos * 256;
}

/* pda.close: expand calls and returns until every stack has a byte edge on top (or is a
   sentinel), then intern the set. `start` is w->todo[0 .. n). Returns the state id or -1. */
static int32_t close_and_intern(Walker *w, int64_t n) {
    int64_t out_n = 0;
    int has_end = 0, has_unknown = 0;
    if (++w->cur_stamp == INT32_MAX) {
        memset(w->stamp, 0, (size_t)w->cap_nodes * sizeof(int32_t));
        w->cur_stamp = 1;
    }
    while (n) {
        int32_t x = w->todo[--n];
        if (x < 0) {
            if (x == END) has_end = 1; else has_unknown = 1;
            continue;
        }
        if (w->stamp[x] == w->cur_stamp) continue;
        w->stamp[x] = w->cur_stamp;
        int32_t pos = w->node_pos[x], parent = w->node_parent[x];
        if (w->scannable[pos]) {
            if (grow((void **)&w->out, &w->cap_out, out_n + 1, sizeof(int32_t))) return -1;
            w->out[out_n++] = x;
        }
        int64_t count = w->call_off[pos + 1] - w->call_off[pos];
        if (grow((void **)&w->todo, &w->cap_todo, n + count + 1, sizeof(int32_t))) return -1;
        for (int64_t k = 0; k < count; k++) {
            const int32_t *pair = w->call_pairs + 2 * (w->call_off[pos] + k);
            int32_t callee = pair[0], ret = pair[1];
            /* returning to a position that only ends its rule = returning to the parent (a tail call) */
            int32_t below = w->pure_end[ret] ? parent : node(w, ret, parent);
            if (below == -1 && !w->pure_end[ret]) return -1;
            int32_t pushed = node(w, callee, below);
            if (pushed < 0) return -1;
            w->todo[n++] = pushed;
        }
        if (w->final[pos]) w->todo[n++] = parent;
    }
    if (grow((void **)&w->out, &w->cap_out, out_n + 2, sizeof(int32_t))) return -1;
    if (has_unknown) w->out[out_n++] = UNKNOWN;
    if (has_end) w->out[out_n++] = END;
    if (out_n > 1) qsort(w->out, (size_t)out_n, sizeof(int32_t), cmp_i32);
    return intern(w, w->out, out_n);
}

/* pda.step: the state after `byte`, memoised; -1 past the limits. */
static int32_t step(Walker *w, int32_t s, int byte) {
    if (s == DEAD) return DEAD;
    int32_t m = w->moves[(int64_t)s * 256 + byte];
    if (m >= 0) return m;
    int64_t n = 0, first = w->state_off[s], last = w->state_off[s + 1];
    if (grow((void **)&w->todo, &w->cap_todo, last - first + 1, sizeof(int32_t))) return -1;
    for (int64_t i = first; i < last; i++) {
        int32_t x = w->members[i];
        if (x < 0) continue;
        const int32_t *row = row_of(w, w->node_pos[x]);
        int32_t t = row[byte];
        if (t >= 0) {
            int32_t moved = node(w, t, w->node_parent[x]);
            if (moved < 0) return -1;
            w->todo[n++] = moved;
        }
    }
    int32_t next = close_and_intern(w, n);
    if (next >= 0) w->moves[(int64_t)s * 256 + byte] = next;
    return next;
}

/* ------------------------------------------------------------------ API */
void walker_free(Walker *w) {
    if (!w) return;
    free(w->node_pos); free(w->node_parent); free(w->stamp); free(w->node_keys); free(w->node_vals);
    free(w->members); free(w->state_off); free(w->has_unknown); free(w->moves); free(w->state_table);
    free(w->todo); free(w->out);
    for (int k = 0; k < w->n_chains; k++) {
        free(w->chains[k].words); free(w->chains[k].rest); free(w->chains[k].rest_lcp);
    }
    free(w);
}

Walker *walker_new(const int32_t *trans, const uint8_t *final, const uint8_t *scannable, const uint8_t *pure_end,
                   const int64_t *call_off, const int32_t *call_pairs, int64_t max_states, int64_t max_nodes) {
    Walker *w = calloc(1, sizeof(Walker));
    if (!w) return NULL;
    w->trans = trans; w->final = final; w->scannable = scannable; w->pure_end = pure_end;
    w->call_off = call_off; w->call_pairs = call_pairs;
    w->max_states = max_states; w->max_nodes = max_nodes;
    if (rehash_nodes(w) || rehash_states(w)) { walker_free(w); return NULL; }
    int64_t cap = 0;
    if (grow((void **)&w->state_off, &cap, 2, sizeof(int64_t))) { walker_free(w); return NULL; }
    w->state_off[0] = 0;
    if (intern(w, NULL, 0) != DEAD) { walker_free(w); return NULL; }   /* state 0: the empty set */
    return w;
}

int64_t walker_num_states(const Walker *w) { return w->n_states; }

int64_t walker_kept_chains(const Walker *w) {   /* loops whose tokens are kept (for the tests) */
    int64_t n = 0;
    for (int k = 0; k < w->n_chains; k++) n += w->chains[k].words != NULL;
    return n;
}

/* For each node of the token trie, where its subtree ends in the sorted order. Token i begins
   the nodes of depths lcp[i] .. len-1 (the deeper ones are new with it); node (i, d) is stored at
   node_off[i] + d - lcp[i], and its subtree ends at the first later token sharing fewer than
   d + 1 bytes with it. */
void trie_ends(int64_t n_tokens, const int64_t *offsets, const int32_t *lcp, const int64_t *node_off,
               int64_t max_len, int64_t *node_end) {
    int64_t *open_at = malloc((size_t)(max_len + 1) * sizeof(int64_t));   /* depth -> its node's slot */
    int64_t depth = 0;                                                   /* open nodes: depths 0 .. depth-1 */
    for (int64_t i = 0; i <= n_tokens; i++) {
        int64_t keep = i < n_tokens ? lcp[i] : 0;
        for (int64_t d = keep; d < depth; d++) node_end[open_at[d]] = i;
        if (i == n_tokens) break;
        int64_t len = offsets[i + 1] - offsets[i];
        for (int64_t d = keep; d < len; d++) open_at[d] = node_off[i] + d - keep;
        depth = len;
    }
    free(open_at);
}

/* Each token's set of bytes, 256 bits as 4 words. */
void token_bytesets(int64_t n_tokens, const uint8_t *bytes, const int64_t *offsets, uint64_t *sets) {
    memset(sets, 0, (size_t)n_tokens * 4 * sizeof(uint64_t));
    for (int64_t i = 0; i < n_tokens; i++)
        for (int64_t k = offsets[i]; k < offsets[i + 1]; k++) sets[4 * i + (bytes[k] >> 6)] |= 1ULL << (bytes[k] & 63);
}

/* A chain from pos: the bytes `inside` that all lead from pos to one position, from that one by
   the same bytes to one next, and so on for `depth` bytes (a bounded string's characters: x{0,40}
   unrolls into such a chain; a string's loop back to pos is a chain without end). A token made
   only of those bytes, no longer than the chain, keeps the stack [pos]'s successor alive to its
   end, whatever lies below: it is accepted without a walk (mask_cache.py's shortcut for loops).
   Returns the depth (0: no chain; INT64_MAX: a loop). */
static int64_t chain(Walker *w, int32_t pos, int64_t max_len, uint64_t inside[4]) {
    const int32_t *row = row_of(w, pos);
    int32_t targets[256], n = 0, best = -1, best_count = 0;
    for (int c = 0; c < 256; c++) if (row[c] >= 0) targets[n++] = row[c];
    qsort(targets, (size_t)n, sizeof(int32_t), cmp_i32);
    for (int k = 0, run = 0; k < n; k++) {   /* the target most bytes lead to */
        run = (k > 0 && targets[k] == targets[k - 1]) ? run + 1 : 1;
        if (run > best_count) { best_count = run; best = targets[k]; }
    }
    memset(inside, 0, 4 * sizeof(uint64_t));
    if (best < 0) return 0;
    for (int c = 0; c < 256; c++) if (row[c] == best) inside[c >> 6] |= 1ULL << (c & 63);
    int64_t depth = 1;
    for (int32_t at = pos, next = best; depth < max_len; depth++) {
        if (next == at) return INT64_MAX;
        const int32_t *r = row_of(w, next);
        int32_t after = -2;
        for (int c = 0; c < 256 && after != -1; c++) {
            if (!(inside[c >> 6] >> (c & 63) & 1)) continue;
            if (after == -2) after = r[c];
            else if (r[c] != after) after = -1;
        }
        if (after < 0) break;   /* the bytes part ways (or stop) here */
        at = next; next = after;
    }
    return depth;
}

static int fits_chain(const uint64_t *set, int64_t len, const uint64_t inside[4], int64_t depth) {
    return depth && len <= depth &&
           !((set[0] & ~inside[0]) | (set[1] & ~inside[1]) | (set[2] & ~inside[2]) | (set[3] & ~inside[3]));
}

/* A loop's tokens, made once per byte set and kept: those that fit it as words, and the rest in
   order, each with the prefix it shares with the one of them before it (the smallest lcp
   since). Only for loops of many bytes (a free string's characters: most of the vocabulary fits
   them; a chain at least as deep as the longest token is a loop to every token), and kept only
   where more than max_listed fit (else words stays NULL and the walk tests each token as it
   goes). A bounded string's chains differ in depth from one character to the next: each is
   walked as it comes. The oldest is dropped when MAX_CHAINS are kept. NULL: not worth it, or
   no memory. */
static ChainTokens *chain_tokens(Walker *w, const uint64_t inside[4], int64_t depth, int64_t n_tokens,
                                 const int64_t *offsets, const int32_t *lcp, const int32_t *ids,
                                 const uint64_t *bytesets, int64_t max_len, int64_t n_words, int64_t max_listed) {
    int bytes_inside = 0;
    for (int k = 0; k < 4; k++) bytes_inside += __builtin_popcountll(inside[k]);
    if (bytes_inside < 64 || depth < max_len) return NULL;
    for (int k = 0; k < w->n_chains; k++) {
        ChainTokens *c = &w->chains[k];
        if (!memcmp(c->inside, inside, sizeof(c->inside))) return c;
    }
    ChainTokens *c = &w->chains[w->next_chain];
    w->next_chain = (w->next_chain + 1) % MAX_CHAINS;
    if (w->n_chains < MAX_CHAINS) w->n_chains++;
    else { free(c->words); free(c->rest); free(c->rest_lcp); }
    memset(c, 0, sizeof(*c));
    memcpy(c->inside, inside, sizeof(c->inside));
    int64_t count = 0;   /* (every token is at most max_len long: only its bytes decide) */
    for (int64_t i = 0; i < n_tokens; i++)
        count += fits_chain(bytesets + 4 * i, offsets[i + 1] - offsets[i], inside, max_len);
    if (count > max_listed) {
        c->words = calloc((size_t)n_words, sizeof(uint32_t));
        c->rest = malloc((size_t)(n_tokens - count + 1) * sizeof(int32_t));
        c->rest_lcp = malloc((size_t)(n_tokens - count + 1) * sizeof(int32_t));
        if (!c->words || !c->rest || !c->rest_lcp) {
            free(c->words); free(c->rest); free(c->rest_lcp);
            memset(c, 0, sizeof(*c));   /* an entry no key matches (a looked-up set has >= 64 bytes) */
            return NULL;
        }
        int32_t shared = INT32_MAX;
        for (int64_t i = 0; i < n_tokens; i++) {
            if (lcp[i] < shared) shared = lcp[i];
            if (fits_chain(bytesets + 4 * i, offsets[i + 1] - offsets[i], inside, max_len)) {
                c->words[ids[i] >> 5] |= 1u << (ids[i] & 31);
            } else {
                c->rest[c->n_rest] = (int32_t)i;
                c->rest_lcp[c->n_rest++] = shared;
                shared = INT32_MAX;
            }
        }
        c->count = count;
    }
    return c;
}

/* Steps token b[0 .. len) from st[j] (st[0] = start); st[k + 1] is the state after its k + 1
   first bytes. Returns the byte it died at, len if it lived, or -2 past the limits. */
static int64_t walk_token(Walker *w, int32_t *st, int32_t start, const uint8_t *b, int64_t len, int64_t j) {
    if (j == 0) {
        int32_t next = step(w, start, b[0]);
        if (next < 0) return -2;
        if (next == DEAD) return 0;
        st[1] = next;
        j = 1;
    }
    int32_t s = st[j];
    for (; j < len; j++) {
        int32_t next = w->moves[(int64_t)s * 256 + b[j]];   /* memoised: one load */
        if (next < 0 && (next = step(w, s, b[j])) < 0) return -2;
        if (next == DEAD) return j;
        st[j + 1] = s = next;
    }
    return len;
}

/* The tokens' verdicts from a stack holding only `pos` over an unknown bottom: accepted ones
   get their bit in accepted_bits (the caller zeroes it; bit j of word w is token 32w + j) and,
   the first max_listed of them, a place in accepted_ids; uncertain ones (they returned into the unknown
   caller before dying) are listed; the rest are rejected. A token that dies at byte d rejects
   (or makes uncertain) its whole trie subtree at once; one that fits pos's chain is accepted
   at once (a kept chain's tokens all at once: only the rest are looked at). Returns the number
   accepted, or -1 past the limits (the walker keeps what it made; the caller may free it and
   start afresh). */
int64_t walker_classify(Walker *w, int32_t pos, int64_t n_tokens, const uint8_t *bytes, const int64_t *offsets,
                        const int32_t *lcp, const int64_t *node_off, const int64_t *node_end, const int32_t *ids,
                        const uint64_t *bytesets, int64_t max_len, int64_t n_words, uint32_t *accepted_bits,
                        int32_t *accepted_ids, int64_t max_listed, int32_t *uncertain, int64_t *n_uncertain) {
    int32_t *st = malloc((size_t)(max_len + 1) * sizeof(int32_t));
    int64_t n_accepted = 0, n_unc = 0;
    if (!st) { n_accepted = -1; goto done; }
    /* the stack [pos] alone, not closed: its first byte is one of pos's own edges (calls from pos
       start stacks whose tops are other positions of the same state, each with its own mask) */
    int32_t start_node = node(w, pos, UNKNOWN);
    int32_t start = start_node < 0 ? -1 : intern(w, &start_node, 1);
    if (start < 0) { n_accepted = -1; goto done; }
    uint64_t inside[4];
    int64_t depth = chain(w, pos, max_len, inside);
    st[0] = start;
    int64_t reach = 0;   /* st[0 .. reach] hold the states along the current token's first bytes */
    ChainTokens *kept = depth ? chain_tokens(w, inside, depth, n_tokens, offsets, lcp, ids, bytesets, max_len,
                                             n_words, max_listed) : NULL;
    if (kept && kept->words) {
        for (int64_t k = 0; k < n_words; k++) accepted_bits[k] |= kept->words[k];
        n_accepted = kept->count;   /* past max_listed: the ids are not listed */
        int64_t c = 0;
        while (c < kept->n_rest) {
            int64_t i = kept->rest[c], len = offsets[i + 1] - offsets[i], shared = kept->rest_lcp[c];
            int64_t dead_at = walk_token(w, st, start, bytes + offsets[i], len, shared < reach ? shared : reach);
            if (dead_at == -2) { n_accepted = -1; goto done; }
            if (dead_at == len) {
                accepted_bits[ids[i] >> 5] |= 1u << (ids[i] & 31);
                n_accepted++;
                reach = len;
                c++;
                continue;
            }
            uint8_t touched = 0;
            for (int64_t k = 1; k <= dead_at; k++) touched |= w->has_unknown[st[k]];
            do {   /* the rest that share the byte it died at die there too */
                if (touched) uncertain[n_unc++] = ids[kept->rest[c]];
                c++;
            } while (c < kept->n_rest && kept->rest_lcp[c] > dead_at);
            reach = dead_at;
        }
        goto done;
    }
    int64_t i = 0;
    while (i < n_tokens) {
        int64_t len = offsets[i + 1] - offsets[i];
        if (fits_chain(bytesets + 4 * i, len, inside, depth)) {
            accepted_bits[ids[i] >> 5] |= 1u << (ids[i] & 31);
            if (n_accepted < max_listed) accepted_ids[n_accepted] = ids[i];
            n_accepted++;
            if (lcp[i] < reach) reach = lcp[i];
            i++;
            continue;
        }
        int64_t dead_at = walk_token(w, st, start, bytes + offsets[i], len, lcp[i] < reach ? lcp[i] : reach);
        if (dead_at == -2) { n_accepted = -1; goto done; }
        if (dead_at == len) {
            accepted_bits[ids[i] >> 5] |= 1u << (ids[i] & 31);
            if (n_accepted < max_listed) accepted_ids[n_accepted] = ids[i];
            n_accepted++;
            reach = len;
            i++;
            continue;
        }
        /* every token below the node that died shares its fate: uncertain if a state on the
           way (after the first byte) had returned into the unknown caller, else rejected */
        int64_t end = node_end[node_off[i] + dead_at - lcp[i]];
        uint8_t touched = 0;
        for (int64_t k = 1; k <= dead_at; k++) touched |= w->has_unknown[st[k]];
        if (touched)
            for (int64_t k = i; k < end; k++) uncertain[n_unc++] = ids[k];
        reach = dead_at;
        i = end;
    }
done:
    free(st);
    *n_uncertain = n_unc;
    return n_accepted;
}
