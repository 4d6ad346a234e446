from django.urls import path

from . import views

app_name = "sensitivity"
urlpatterns = [
    path("mutants/", views.mutant_list, name="mutants"),
    path("mutants/<str:mutant_id>/", views.mutant_detail, name="mutant"),
]
