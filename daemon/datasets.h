/* Dataset handlers: PutDataset (flat, or sharded in parts), GetDataset, ListDatasets, DeleteDataset. */
#ifndef PD_DATASETS_H
#define PD_DATASETS_H

#include <stdint.h>

#include "daemon/service.h"
#include "proto/frame.h"

void pd_on_put_dataset(pd_session *s, uint64_t id, const Permd__V1__PutDataset *m);
void pd_on_get_dataset(pd_session *s, uint64_t id, const Permd__V1__GetDataset *m);
void pd_on_list_datasets(pd_session *s, uint64_t id, const Permd__V1__ListDatasets *m);
void pd_on_delete_dataset(pd_session *s, uint64_t id, const Permd__V1__DeleteDataset *m);

/* Bytes of entries one List reply (ListDatasets, ListMixtures) holds at most: what every client reads
 * (8 x max_count + 64 KiB), less the envelope's. A longer list comes in pages to clients that ask. */
uint64_t pd_list_budget(const pd_config *cfg);
/* What a repeated message field's entry of `packed` bytes adds to a reply. */
size_t pd_list_entry_bytes(size_t packed);

/* Free a session's unfinished sharded upload (at teardown). NULL is a no-op. */
void pd_upload_free(struct pd_upload *u);
/* The connection's alarm went off: drop its unfinished upload if no part came within upload_timeout_ms
 * (its memory freed; its next part is answered INVALID_ARGUMENT saying so). */
void pd_datasets_on_alarm(pd_session *s);

#endif
