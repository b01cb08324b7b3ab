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

/* Free a session's unfinished sharded upload (at teardown). NULL is a no-op. */
void pd_upload_free(struct pd_upload *u);
/* The connection's alarm went off: drop its unfinished upload if no part came within upload_timeout_ms
 * (its memory freed; its next part is answered INVALID_ARGUMENT saying so). */
void pd_datasets_on_alarm(pd_session *s);

#endif
