/* k3_fixture.h — K3's config.json (specs/k3.md §1, the real values and
 * layer lists) for tests that need full-size shapes without weights. */
#ifndef SHOAL_TESTS_LIB_K3_FIXTURE_H
#define SHOAL_TESTS_LIB_K3_FIXTURE_H

#include "common/buf.h"
#include "common/k3_config.h"

/* K3's config.json text into out (appended).  0 or -1. */
int k3_fixture_json(shoal_buf *out);

/* K3's config parsed.  0 or -1. */
int k3_fixture_config(k3_config *out);

/* A small K3-family config (4 layers: KDA dense, KDA MoE, MLA MoE, KDA
 * MoE; hidden 64; W_UK^T 16 wide, so f32 in every mode) as text and
 * parsed.  0 or -1. */
int k3_fixture_small_json(shoal_buf *out);
int k3_fixture_small_config(k3_config *out);

#endif
