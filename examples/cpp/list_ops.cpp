// Lists every torchext op registered with torch's dispatcher, with its schema. It calls no torchext function, so the
// program references no symbol of libtorchext.so: the ops are registered because torchext::torchext links the
// library with --no-as-needed, and loading it runs its static registrations.
#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

int main() {
  std::vector<std::string> schemas;
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
    if (name.name.rfind("torchext::", 0) != 0) continue;
    const auto op = dispatcher.findOp(name);
    std::ostringstream text;
    text << op->schema();
    schemas.push_back(text.str());
  }
  std::sort(schemas.begin(), schemas.end());
  for (const std::string& schema : schemas) std::cout << schema << "\n";
  std::cout << schemas.size() << " torchext ops" << std::endl;
  return schemas.empty() ? 1 : 0;
}
