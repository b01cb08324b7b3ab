/* Definition hashes: what a dataset or mixture name's orders depend on, folded into one word that a request names (Slice.definition). */
#ifndef PD_DEFINITION_H
#define PD_DEFINITION_H

#include <stdint.h>

/* Words are folded in one at a time from a start of 0 (registry.c's pd_dataset_definition, mixdef.c's
 * pd_mixdef_hash, each with a tag word first so a dataset's and a mixture's never coincide by layout);
 * pd_definition_done makes the result non-zero, since 0 means "unchecked" on the wire. */
uint64_t pd_definition_add(uint64_t h, uint64_t word);
uint64_t pd_definition_done(uint64_t h);

#endif
