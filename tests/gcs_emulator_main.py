"""Runs gcp-storage-emulator with two behaviours of Cloud Storage it lacks.

The emulator is a real HTTP server of the GCS JSON API, but (in the pinned
version) it (1) sends no `x-goog-generation` header with a download, which
tensorstore's OCDBT reader (orbax checkpoints) needs and refuses as
"Malformed StorageGeneration"; (2) ignores `ifGenerationMatch` on an
upload, which the workdir lock relies on; (3) ignores a listing's
`startOffset`/`endOffset`, with which tensorstore lists a directory; and (4)
drops the connection on an empty upload (an empty `config.gin`). All four
are fixed here as GCS documents them (a failed precondition is HTTP
412), before its server module reads the handlers. Run as `python gcs_emulator_main.py start --port N ...`.
"""

import http
import json
import sys

from gcp_storage_emulator import exceptions
from gcp_storage_emulator.handlers import objects


def _generation(storage, bucket_name: str, object_id: str) -> str | None:
  try:
    return storage.get_file_obj(bucket_name, object_id)["generation"]
  except exceptions.NotFound:
    return None


_download = objects.download
_insert = objects.insert


def download(request, response, storage, *args, **kwargs):
  generation = _generation(storage, request.params["bucket_name"],
                           request.params["object_id"])
  if generation is not None:
    response["x-goog-generation"] = generation
  return _download(request, response, storage, *args, **kwargs)


def insert(request, response, storage, *args, **kwargs):
  match = request.query.get("ifGenerationMatch")
  if match and "name" in request.query:
    current = _generation(storage, request.params["bucket_name"],
                          request.query["name"][0])
    if (current or "0") != match[0]:
      response.status = http.HTTPStatus.PRECONDITION_FAILED
      response.json({"error": {"code": 412,
                               "message": "Precondition Failed"}})
      return None
  if request.query.get("uploadType") == ["media"] and request.data is None:
    request._data = b""  # pylint: disable=protected-access  (empty object)
  return _insert(request, response, storage, *args, **kwargs)


_ls = objects.ls


def ls(request, response, storage, *args, **kwargs):
  result = _ls(request, response, storage, *args, **kwargs)
  start = (request.query.get("startOffset") or [""])[0]
  end = (request.query.get("endOffset") or [None])[0]
  if (start or end) and response.status == http.HTTPStatus.OK:
    listing = json.loads(response._content)  # pylint: disable=protected-access
    listing["items"] = [o for o in listing.get("items", [])
                        if o["name"] >= start and (end is None
                                                   or o["name"] < end)]
    response.json(listing)
  return result


objects.download = download
objects.insert = insert
objects.ls = ls

if __name__ == "__main__":
  # Imported after the handlers are replaced: its route table reads them.
  from gcp_storage_emulator import __main__ as emulator  # pylint: disable=g-import-not-at-top
  sys.exit(emulator.main(sys.argv[1:]))
