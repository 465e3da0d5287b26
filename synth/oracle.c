/* oracle.c — the oracle preset: tiny-k3's files with constructed weights.
 *
 * Owns: the construction (docs/mkmodel.md "The oracle" derives it): which
 * tensors are constructed (synth_oracle_tag, by name) and the value of
 * every element of those (synth_oracle_fill, from the element's index, so
 * hubmock can serve any byte range).  Everything else keeps tiny's seeded
 * recipes (weights.c).  Does not own the tensor list (tensors.c).
 *
 * In one paragraph: the greedy continuation of SYNTH_ORACLE_PROMPT is a
 * bigram chain over 24 symbols (":" , the 22 tokens of SYNTH_ORACLE_TEXT,
 * eos).  A symbol's embedding is a one-hot code in the stream; the dense
 * layer 0 and each of the 7 MoE layers is one "hop" that reads the code
 * the hop before wrote (each hop writes its own 24 dimensions and a marker
 * dimension) and writes it again, the last hop as the next token's code,
 * which lm_head reads.  In a MoE layer the router sends symbol k to its own
 * routed expert (a different expert in each layer) plus three decoys; the
 * symbol's expert maps the layer's constant latent input to the code, and
 * its MXFP4 bytes and the decoys are built so that wrong nibble order,
 * scale exponents, record order, routing weights or expert selection give
 * another code.  Every MLP's AttnRes mix must pick the one vector that
 * holds the previous hop's marker; the embedding carries louder wrong codes
 * for every hop, so a mix that does not pick sharply reads those.
 * Attention's o_proj is zero: attention contributes nothing.
 */
#include "synth/synth_int.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

const uint16_t synth_oracle_prompt_ids[SYNTH_ORACLE_PROMPT_TOKENS] = {
    322, 264, 386, 99, 296, 260, 97, 536, 58,
};
const uint16_t synth_oracle_text_ids[SYNTH_ORACLE_TEXT_TOKENS] = {
    700, 97, 355, 404, 642, 713, 306, 303, 287, 271, 318,
    366, 116, 44, 276, 257, 104, 316, 479, 443, 712, 46,
};

/* ---- the layout ------------------------------------------------------------
 * Symbols k: 0 = the prompt's last token ":", 1..22 the text's tokens,
 * 23 = eos.  Outputs o: 0..21 the text's tokens, 22 = eos; symbol k's next
 * token is output min(k, 22).  Hop j = 0 is layer 0's dense MLP, hop j >= 1
 * layer j's MoE; hop j writes subspace S_j (symbols for j < 7, outputs for
 * j = 7). */
enum {
    NSYM = 24, NOUT = 23, VOCAB = 1024, HID = 256, LAYERS = 8, EXPERTS = 64,
    EOS = 770,
    H_SE = 0,              /* the embedding's code, 24 dims */
    H_S0 = 24,             /* hop j's code: H_S0 + 24 j, 24 dims (j = 0..7) */
    H_ME = 216,            /* the embedding's marker */
    H_MU0 = 217,           /* hop j's marker: H_MU0 + j */
    H_TC0 = 224,           /* hop j's trap for the saturated decoy: H_TC0 + j (j = 1..7) */
    H_TD = 232,            /* the trap of the cancelling decoys */
    H_TP = 233,            /* the trap of X's cancelling units */
    /* latent: the 4 dims the constant input lives on, one per 32-group and
     * even, so a nibble swap reads zeros */
    NZ = 4,
    L_C = 24, L_D = 25, L_P = 26,   /* latent outputs of the decoys */
    /* expert slots of a layer */
    SLOT_X = NSYM, SLOT_DP, SLOT_DM, SLOT_T, NSLOT,
    UNITS_A = 32, UNITS_B = 30, UNITS_C = 23, UNITS_D = 36, UNITS_PQ = 8,   /* of each P, Q kind */
};

#define H_S(j)  (H_S0 + 24 * (j))
#define H_MU(j) (H_MU0 + (j))
#define H_TC(j) (H_TC0 + (j))
static const int zdim[NZ] = { 2, 36, 70, 104 };

/* Router: a symbol expert's logit is BETA (x[code k] - TAU x[marker]); the
 * decoys X, D+ and T read GAMMA x[marker] (saturated: s = 1), D- has a zero
 * row (s = 1/2 exactly).  Selection biases as in docs/mkmodel.md. */
#define BETA  30.0
#define TAU   0.8
#define GAMMA 8.0
#define DIST  3.0               /* the embedding's wrong codes, x the right ones */
#define MIXW  2.0               /* res_norm ⊙ res_proj at the target marker */

/* The kinds of hidden unit: gate and up pre-activations, each the sum of
 * four MXFP4 values (one per z dim, z = 1 there).  A: gate saturated, up
 * linear (output ~ s^2 under a scale error s); B: both linear (~ s^3); C:
 * both saturated (~ s): their mix is right only at s = 1.  P1, P2 (up +4)
 * and Q1, Q2 (up -4), 8 units each, gate saturated, at scale 2^0: they
 * cancel exactly, and a wrong value for e2m1 magnitude m moves their sum by
 * C_m (its signed count over the four) times the error; C = (2, -2, -4,
 * -1, -3, 3, 1) for 0.5, 1, 1.5, 2, 3, 4, 6 is nonzero and has no two
 * equal, so neither one wrong table value nor two swapped ones cancel. */
enum { U_A, U_B, U_C, U_P1, U_P2, U_Q1, U_Q2, U_NONE };
static const double unit_terms[7][2][NZ] = {
    { { 4, 3, 2, -1 },            { -3, -2, -1.5, 0.5 } },      /* A: g 8,   u -6 */
    { { 0.25, 0.125, 0.25, -0.125 }, { 2, 1.5, 1, -0.5 } },     /* B: g 0.5, u 4 */
    { { 8, 6, 4, 2 },             { 96, 64, 32, 8 } },          /* C: g 20,  u 200 */
    { { 4, 3, 2, -1 },            { -1, -3, 4, 4 } },           /* P1: g 8, u 4 */
    { { 4, 3, 2, -1 },            { 0.5, -1, -1.5, 6 } },       /* P2 */
    { { 4, 3, 2, -1 },            { 0.5, -1.5, -1.5, -1.5 } },  /* Q1: g 8, u -4 */
    { { 4, 3, 2, -1 },            { -2, -3, -3, 4 } },          /* Q2 */
};
#define W2_A  (-0.03125)         /* -2^-5: A's units to the next code */
#define W2_B  0.375              /* B's units to the wrong code */
#define W2_C  0.005859375        /* 1.5·2^-8: X's C units to its trap */
#define W2_PQ 1.5                /* X's P and Q units, to their own trap */
#define W2_D  0.0625             /* 2^-4: D+ and T; D- is -2^-3, the same codes negated */

typedef struct oracle_plan {
    int16_t tok_sym[VOCAB];      /* symbol of a token, or -1 */
    int16_t tok_out[VOCAB];      /* output index of a token, or -1 */
    int8_t  slot[LAYERS][EXPERTS]; /* a layer's expert -> slot, or -1 (not used) */
    double  rms[LAYERS + 1];     /* rms of what layer l's MLP reads; [0] an embedding
                                    row, [LAYERS] the tail's */
    double  up_w;                /* routed_up: the next code comes out as 1 */
    double  inv_unit;            /* 1 / SiTU(8, 1): a unit that writes 1 */
} oracle_plan;

static oracle_plan plan;
static pthread_once_t plan_once = PTHREAD_ONCE_INIT;

static double situ(double g, double u)
{
    return 4.0 * tanh(g / 4.0) / (1.0 + exp(-g)) * 25.0 * tanh(u / 25.0);
}

static double unit_pre(int kind, int up)
{
    double s = 0;
    for (int q = 0; q < NZ; q++)
        s += unit_terms[kind][up][q];
    return s;
}

static int sym_token(int k)
{
    return k == 0 ? synth_oracle_prompt_ids[SYNTH_ORACLE_PROMPT_TOKENS - 1]
         : k <= SYNTH_ORACLE_TEXT_TOKENS ? synth_oracle_text_ids[k - 1] : EOS;
}

static int out_token(int o)
{
    return o < SYNTH_ORACLE_TEXT_TOKENS ? synth_oracle_text_ids[o] : EOS;
}

/* Index symbol k has in hop j's subspace, and the subspace's width. */
static int hop_index(int j, int k) { return j < 7 ? k : (k < NOUT - 1 ? k : NOUT - 1); }
static int hop_width(int j) { return j < 7 ? NSYM : NOUT; }
/* The embedding's wrong code in S_j, and hop j's wrong code (B units). */
static int dist_index(int j, int k) { return (hop_index(j, k) + 5 + j) % hop_width(j); }
static int wrong_index(int j, int k) { return (hop_index(j, k) + 7) % hop_width(j); }
/* Layer l's expert for slot s: a different permutation in every layer. */
static int slot_expert(int l, int s) { return (37 * s + 11 * l) % EXPERTS; }

/* The rms of the vector each MLP mix must pick, from AttnRes's bookkeeping
 * (k3.md §3.2, block 3, attention adding nothing): a set of hops per vector,
 * whose dims are disjoint, so its squared norm is the sum of theirs. */
static void plan_rms(const double hop_sq[LAYERS])
{
    unsigned anchors[LAYERS], prefix = 0, h = 0;
    int na = 0;

    plan.rms[0] = sqrt((1.0 + 8 * DIST * DIST + 1.0) / HID);
    for (int i = 0; i <= LAYERS; i++) {
        unsigned want = i ? 1u << (i - 1) : 0, mask = 0;
        if (i < LAYERS && i % 3 == 0) {
            anchors[na++] = h;
            prefix = 0;
        } else {
            prefix = h;
        }
        for (int a = 0; a < na; a++)
            if (anchors[a] & want)
                mask = anchors[a];
        if (prefix & want)
            mask = prefix;
        if (i > 0) {
            double sq = 0;
            for (int j = 0; j < LAYERS; j++)
                if (mask & (1u << j))
                    sq += hop_sq[j];
            plan.rms[i] = sqrt(sq / HID);
        }
        h = prefix | (1u << i);
    }
}

static void plan_build(void)
{
    double a = UNITS_A * -W2_A * -situ(unit_pre(U_A, 0), unit_pre(U_A, 1));
    double b = UNITS_B * W2_B * situ(unit_pre(U_B, 0), unit_pre(U_B, 1));
    double c = UNITS_C * W2_C * situ(unit_pre(U_C, 0), unit_pre(U_C, 1));
    double rb = b / a, rc = c / a, hop_sq[LAYERS];

    memset(plan.tok_sym, 0xff, sizeof plan.tok_sym);
    memset(plan.tok_out, 0xff, sizeof plan.tok_out);
    memset(plan.slot, 0xff, sizeof plan.slot);
    for (int k = 0; k < NSYM; k++)
        plan.tok_sym[sym_token(k)] = (int16_t)k;
    for (int o = 0; o < NOUT; o++)
        plan.tok_out[out_token(o)] = (int16_t)o;
    for (int l = 1; l < LAYERS; l++)
        for (int s = 0; s < NSLOT; s++)
            plan.slot[l][slot_expert(l, s)] = (int8_t)s;
    /* RMSNorm(U) puts the next code at a / rms(a, b, c) over 128 dims */
    plan.up_w = sqrt((1.0 + rb * rb + rc * rc) / 128.0);
    plan.inv_unit = 1.0 / situ(8.0, 1.0);
    hop_sq[0] = 2.0;                                /* code 1, marker 1 */
    for (int j = 1; j < LAYERS; j++)
        hop_sq[j] = 2.0 + rb * rb + rc * rc;        /* + the wrong code and the trap */
    plan_rms(hop_sq);
}

static const oracle_plan *get_plan(void)
{
    pthread_once(&plan_once, plan_build);
    return &plan;
}

/* ---- tagging ---------------------------------------------------------------- */

enum {
    R_NONE, R_EMBED, R_LM_HEAD, R_ONE, R_ZERO, R_RES_NORM, R_RES_PROJ,
    R_DENSE_GATE, R_DENSE_UP, R_DENSE_DOWN, R_ROUTER, R_BIAS, R_RDOWN, R_RUP,
    R_SH_GATE, R_SH_UP, R_SH_DOWN,
    R_W1P, R_W1S, R_W2P, R_W2S, R_W3P, R_W3S,
};

static const struct { const char *suffix; uint8_t role; } layer_roles[] = {
    { "post_attention_layernorm.weight", R_ONE },
    { "mlp_res_norm.weight", R_RES_NORM },
    { "mlp_res_proj.weight", R_RES_PROJ },
    { "self_attn.o_proj.weight", R_ZERO },
    { "mlp.gate_proj.weight", R_DENSE_GATE },
    { "mlp.up_proj.weight", R_DENSE_UP },
    { "mlp.down_proj.weight", R_DENSE_DOWN },
    { "block_sparse_moe.gate.weight", R_ROUTER },
    { "block_sparse_moe.gate.e_score_correction_bias", R_BIAS },
    { "block_sparse_moe.routed_expert_down_proj.weight", R_RDOWN },
    { "block_sparse_moe.routed_expert_up_proj.weight", R_RUP },
    { "block_sparse_moe.routed_expert_norm.weight", R_ONE },
    { "block_sparse_moe.shared_experts.gate_proj.weight", R_SH_GATE },
    { "block_sparse_moe.shared_experts.up_proj.weight", R_SH_UP },
    { "block_sparse_moe.shared_experts.down_proj.weight", R_SH_DOWN },
};

static uint8_t expert_role(const char *rest, const oracle_plan *p, int layer, int *expert)
{
    int e, w, n = 0;
    char kind[8];

    if (sscanf(rest, "block_sparse_moe.experts.%d.w%d.weight_%7[a-z]%n", &e, &w, kind, &n) != 3 ||
        rest[n] || e < 0 || e >= EXPERTS || w < 1 || w > 3 || p->slot[layer][e] < 0)
        return R_NONE;    /* an expert no slot uses keeps tiny's random bytes */
    *expert = e;
    if (!strcmp(kind, "packed"))
        return (uint8_t)(R_W1P + 2 * (w - 1));
    return !strcmp(kind, "scale") ? (uint8_t)(R_W1S + 2 * (w - 1)) : R_NONE;
}

static uint8_t role_of(const char *name, const oracle_plan *p, int *layer, int *expert)
{
    static const char pfx[] = "language_model.";
    int n = 0;

    *layer = 0;
    *expert = 0;
    if (strncmp(name, pfx, sizeof pfx - 1))
        return R_NONE;
    name += sizeof pfx - 1;
    if (!strcmp(name, "model.embed_tokens.weight"))
        return R_EMBED;
    if (!strcmp(name, "lm_head.weight"))
        return R_LM_HEAD;
    if (!strcmp(name, "model.norm.weight"))
        return R_ONE;
    if (!strcmp(name, "model.output_attn_res_norm.weight")) {
        *layer = LAYERS;
        return R_RES_NORM;
    }
    if (!strcmp(name, "model.output_attn_res_proj.weight")) {
        *layer = LAYERS;
        return R_RES_PROJ;
    }
    if (sscanf(name, "model.layers.%d.%n", layer, &n) != 1 || n == 0 || *layer < 0 ||
        *layer >= LAYERS)
        return R_NONE;
    for (size_t i = 0; i < sizeof layer_roles / sizeof layer_roles[0]; i++)
        if (!strcmp(name + n, layer_roles[i].suffix))
            return layer_roles[i].role;
    return expert_role(name + n, p, *layer, expert);
}

void synth_oracle_tag(const synth_config *cfg, synth_tensors *ts)
{
    const oracle_plan *p = get_plan();

    (void)cfg;        /* synth_config_finish pinned the shapes to tiny's */
    for (size_t i = 0; i < ts->count; i++) {
        synth_tensor *t = &ts->t[i];
        int layer, expert;
        uint8_t role = role_of(synth_tensor_name(ts, t), p, &layer, &expert);
        if (role == R_NONE)
            continue;
        t->init = SYNTH_INIT_ORACLE;
        t->role = role;
        t->layer = (uint8_t)layer;
        t->expert = (uint16_t)expert;
    }
}

/* ---- values ------------------------------------------------------------------ */

/* The mix target of layer l's MLP (l = LAYERS: the tail): the marker of
 * the hop before, or the embedding's for layer 0. */
static int mix_marker(int l) { return l == 0 ? H_ME : H_MU(l - 1); }

static double embed_value(const synth_tensor *t, const oracle_plan *p, uint64_t i, int r, int c)
{
    int k = p->tok_sym[r];

    if (k < 0)        /* not in the chain: tiny's random row */
        return (2.0 * synth_unit(t, i) - 1.0) * sqrt(3.0 / HID);
    if (c == H_SE + k || c == H_ME)
        return 1.0;
    for (int j = 0; j < LAYERS; j++)
        if (c == H_S(j) + dist_index(j, k))
            return DIST;
    return 0.0;
}

static double lm_head_value(const synth_tensor *t, const oracle_plan *p, uint64_t i, int r, int c)
{
    int o = p->tok_out[r];

    if (o < 0)        /* quiet random rows: a broken stream reads as noise */
        return (2.0 * synth_unit(t, i) - 1.0) * sqrt(3.0 / HID) / 16.0;
    return c == H_S(7) + o ? 1.0 : 0.0;
}

static double router_value(const oracle_plan *p, int l, int e, int c)
{
    int s = p->slot[l][e];

    if (s >= 0 && s < NSYM)
        return c == H_S(l - 1) + s ? BETA : c == H_MU(l - 1) ? -BETA * TAU : 0.0;
    if (s == SLOT_X || s == SLOT_DP || s == SLOT_T)
        return c == H_MU(l - 1) ? GAMMA : 0.0;
    return 0.0;       /* D- (s = 1/2 exactly) and the unused experts */
}

static double bias_value(const oracle_plan *p, int l, int e)
{
    switch (p->slot[l][e]) {
    case -1:      return -1.0;       /* never selected */
    case SLOT_DP:
    case SLOT_DM: return 0.3;        /* weights from s + bias would not cancel */
    case SLOT_T:  return -0.8;       /* selected only if the bias is ignored */
    default:      return 0.0;
    }
}

static double dense_value(const oracle_plan *p, int role, int r, int c)
{
    double rms = p->rms[0];

    switch (role) {
    case R_DENSE_GATE:   /* units 0..23 the symbols, 24 the marker: gate 8 */
        return r <= NSYM && c == H_ME ? 8.0 * rms : 0.0;
    case R_DENSE_UP:     /* up 1 */
        return (r < NSYM && c == H_SE + r) || (r == NSYM && c == H_ME) ? rms : 0.0;
    default:             /* down: unit k -> S_0 + k, unit 24 -> marker */
        return (r >= H_S(0) && r < H_S(0) + NSYM && c == r - H_S(0)) ||
               (r == H_MU(0) && c == NSYM) ? p->inv_unit : 0.0;
    }
}

static double moe_value(const oracle_plan *p, int role, int l, int r, int c)
{
    double rms = p->rms[l];

    switch (role) {
    case R_RDOWN:        /* z = 1 on the z dims, from the marker */
        for (int q = 0; q < NZ; q++)
            if (r == zdim[q])
                return c == H_MU(l - 1) ? rms : 0.0;
        return 0.0;
    case R_RUP:          /* latent code i -> S_l + i; the decoys to their traps */
        if (r >= H_S(l) && r < H_S(l) + hop_width(l))
            return c == r - H_S(l) ? p->up_w : 0.0;
        return (r == H_TC(l) && c == L_C) || (r == H_TD && c == L_D) || (r == H_TP && c == L_P)
                   ? p->up_w : 0.0;
    case R_SH_GATE:      /* one shared unit writes this hop's marker */
        return r == 0 && c == H_MU(l - 1) ? 8.0 * rms : 0.0;
    case R_SH_UP:
        return r == 0 && c == H_MU(l - 1) ? rms : 0.0;
    default:             /* R_SH_DOWN */
        return r == H_MU(l) && c == 0 ? p->inv_unit : 0.0;
    }
}

/* A float tensor's element i (row r, column c). */
static double float_value(const synth_tensor *t, uint64_t i)
{
    const oracle_plan *p = get_plan();
    uint64_t cols = t->ndim == 2 ? t->shape[1] : t->shape[0];
    int r = t->ndim == 2 ? (int)(i / cols) : 0, c = (int)(i % cols), l = t->layer;

    switch (t->role) {
    case R_EMBED:      return embed_value(t, p, i, r, c);
    case R_LM_HEAD:    return lm_head_value(t, p, i, r, c);
    case R_ONE:        return 1.0;
    case R_ZERO:       return 0.0;
    case R_RES_NORM:   return c == mix_marker(l) ? -1.0 : 1.0;      /* the sign flip: */
    case R_RES_PROJ:   return c == mix_marker(l) ? -MIXW : 0.0;     /* norm and proj both count */
    case R_ROUTER:     return router_value(p, l, r, c);
    case R_BIAS:       return bias_value(p, l, c);
    case R_DENSE_GATE:
    case R_DENSE_UP:
    case R_DENSE_DOWN: return dense_value(p, t->role, r, c);
    default:           return moe_value(p, t->role, l, r, c);
    }
}

/* ---- experts ----------------------------------------------------------------
 * Each (row, 32-column group) of an expert record holds one value, at one or
 * all of its columns; mx_encode picks its code and scale byte, varying the
 * exponent with the row and group so the bytes use many scales. */

static const double e2m1[8] = { 0, 0.5, 1, 1.5, 2, 3, 4, 6 };

/* variant: which of v's encodings (m·2^e, m an e2m1 value); ~0u: exponent 0. */
static void mx_encode(double v, unsigned variant, uint8_t *code, uint8_t *scale)
{
    double a = fabs(v);
    int codes[16], exps[16], n = 0;

    for (int m = 1; m < 8; m++) {
        int e;
        double f = frexp(a / e2m1[m], &e);      /* a / m = f·2^e, f in [0.5, 1) */
        if (f == 0.5 && n < 16 && e - 1 >= -126 && e - 1 <= 127) {
            codes[n] = m;
            exps[n++] = e - 1;
        }
    }
    if (a == 0 || n == 0) {     /* only zeros here (the values above all encode) */
        *code = 0;
        *scale = 127;
        return;
    }
    if (variant == ~0u) {
        for (variant = 0; variant + 1 < (unsigned)n && exps[variant] != 0; variant++)
            ;
    }
    variant %= (unsigned)n;
    *code = (uint8_t)(codes[variant] | (v < 0 ? 8 : 0));
    *scale = (uint8_t)(exps[variant] + 127);
}

/* Unit kind of row r of an expert's w1/w3 in a slot. */
static int unit_kind(int slot, int r)
{
    if (slot < NSYM)
        return r < UNITS_A ? U_A : r < UNITS_A + UNITS_B ? U_B : U_NONE;
    if (slot == SLOT_X)        /* block 0: C; block 1: P1, P2, Q1, Q2 */
        return r < UNITS_C ? U_C : r < 32 ? U_NONE : U_P1 + (r - 32) / UNITS_PQ;
    return r < UNITS_D ? U_C : U_NONE;
}

/* The value of group g of row r of record w (1..3) of slot's expert in
 * layer l (0 if the group is all zeros), and its column set: *all = 1 when
 * every column of [lo, hi) holds it, else only column *col. */
static double group_value(int l, int slot, int w, int r, int g, int *all, int *lo, int *hi)
{
    *all = 0;
    *lo = *hi = 0;
    if (w != 2) {        /* w1 (gate) / w3 (up): one value, at the group's z dim */
        int kind = unit_kind(slot, r);
        *lo = zdim[g];
        return kind == U_NONE ? 0.0 : unit_terms[kind][w == 3][g];
    }
    *all = 1;            /* w2: rows are latent outputs, columns units */
    *lo = 32 * g;
    if (slot < NSYM) {
        int out = hop_index(l, slot), wrong = wrong_index(l, slot);
        *hi = g == 0 ? UNITS_A : UNITS_A + UNITS_B;
        return g == 0 && r == out ? W2_A : g == 1 && r == wrong ? W2_B : 0.0;
    }
    if (slot == SLOT_X) {
        *hi = g == 0 ? UNITS_C : 64;
        return g == 0 ? (r == L_C ? W2_C : 0.0) : (r == L_P ? W2_PQ : 0.0);
    }
    *hi = UNITS_D < 32 * (g + 1) ? UNITS_D : 32 * (g + 1);
    return r == L_D ? (slot == SLOT_DM ? -2 * W2_D : W2_D) : 0.0;
}

/* Code and scale byte of group g of row r. */
static void group_code(int l, int slot, int w, int r, int g, uint8_t *code, uint8_t *scale,
                       int *all, int *lo, int *hi)
{
    double v = group_value(l, slot, w, r, g, all, lo, hi);
    int kind = w == 2 ? U_NONE : unit_kind(slot, r);
    /* P and Q keep exponent 0: their codes are the table's magnitudes */
    unsigned variant = kind >= U_P1 && kind <= U_Q2 ? ~0u : (unsigned)(r * 4 + g + w);

    if (slot == SLOT_DM && w == 2 && v != 0) {   /* D+'s codes negated, exponent + 1: */
        mx_encode(-v / 2, variant, code, scale);   /* exactly -2 x D+ */
        *code |= 8;
        (*scale)++;
        return;
    }
    mx_encode(v, variant, code, scale);
}

static uint8_t expert_byte(const synth_tensor *t, uint64_t i)
{
    const oracle_plan *p = get_plan();
    int w = (t->role - R_W1P) / 2 + 1, packed = (t->role - R_W1P) % 2 == 0;
    int slot = p->slot[t->layer][t->expert];
    uint64_t cols = t->shape[1];            /* packed: bytes a row; scale: groups a row */
    int r = (int)(i / cols), all, lo, hi;
    uint8_t code, scale;

    if (!packed) {
        group_code(t->layer, slot, w, r, (int)(i % cols), &code, &scale, &all, &lo, &hi);
        return scale;
    }
    uint8_t b = 0;
    for (int half = 0; half < 2; half++) {   /* column 2j: low nibble, 2j+1: high */
        int col = (int)(i % cols) * 2 + half;
        group_code(t->layer, slot, w, r, col / 32, &code, &scale, &all, &lo, &hi);
        if (all ? col >= lo && col < hi : col == lo)
            b |= (uint8_t)(code << (4 * half));
    }
    return b;
}

void synth_oracle_fill(const synth_tensor *t, uint64_t first, uint64_t count, uint8_t *out)
{
    for (uint64_t n = 0; n < count; n++) {
        uint64_t i = first + n;
        if (t->dtype == SYNTH_U8) {
            out[n] = expert_byte(t, i);
            continue;
        }
        float f = (float)float_value(t, i);
        if (t->dtype == SYNTH_BF16) {
            uint16_t h = synth_bf16_from_float(f);
            out[2 * n] = (uint8_t)h;
            out[2 * n + 1] = (uint8_t)(h >> 8);
        } else {
            uint32_t b;
            memcpy(&b, &f, 4);
            shoal_wr_le32(out + 4 * n, b);
        }
    }
}
